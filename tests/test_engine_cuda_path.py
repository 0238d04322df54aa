"""The CUDA path's step logic (engine/backends/torch/cuda.py: static caches, fixed-shape padded steps,
explicit positions, device verification) run on the CPU without graphs: greedy tokens identical to the
eager TorchPair and to plain decoding, on tiny random pairs (DFlash and DFlash2 drafters, Qwen3, Llama and
Qwen3.5 hybrid targets, whose DeltaNet state rolls back in fixed buffers: cuda_hybrid.py), through full,
partial and no acceptance. What only a GPU can check (CUDA graph capture
and replay, greedy tokens in bfloat16) is in the cuda-only tests at the end, which CI never runs (they
passed on a lent H100: bench/gpu_checks.sh)."""
import os

import pytest
import torch

from engine.backends.torch import cpu
from engine.backends.torch.cuda import CudaPair, PendingDrafts, static_mask, supported
from engine.backends.torch.draft_runner import block_mask
from engine.backends.torch.tiny import random_drafter, random_pair, random_target
from engine.limits import GenerationSettings
from engine.loop import Generation
from tests.oracle import OraclePair

SIZES = dict(vocab=256, hidden=64, layers=4, max_positions=512)


def static_of(pair, **kwargs):
    """Buckets of 64 rows, so the steps of these short runs cross several attention lengths (one graph each)."""
    return CudaPair(pair.target, pair.drafter, None, pair.name, pair.info["architecture"], context=300,
                    graphs=False, bucket=64, **kwargs)


def prompt_of(n, seed=0):
    return torch.randint(0, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def run(pair, prompt, n=24, block=None, baseline=False):
    settings = GenerationSettings(max_new_tokens=n, block_size=block, draft_cutoff=0.0, plain_fallback=False)
    return Generation(pair, prompt, settings, baseline=baseline).run()


@pytest.fixture(scope="module", params=[("qwen3", 1), ("llama", 1), ("qwen3", 2), ("qwen3_5", 1), ("qwen3_5", 2)])
def pairs(request):
    """Both drafters in float32: drafts compared token for token need one rounding (on a CPU with native
    bfloat16 TorchPair would draft in bfloat16, where the padded static shapes round differently)."""
    arch, generation = request.param
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu, "draft_dtype", lambda: None)
        eager = random_pair(arch, seed=3, generation=generation, head_scale=4.0, **SIZES)
        return eager, static_of(eager, use_kernels=False)


@pytest.mark.parametrize("prompt_len", [1, 17, 130])
def test_static_steps_give_the_eager_engines_greedy_tokens(pairs, prompt_len):
    eager, static = pairs
    prompt = prompt_of(prompt_len, seed=prompt_len)
    plain = run(eager, prompt, baseline=True)
    assert run(static, prompt, baseline=True).tokens == plain.tokens
    for block in (2, 5, 16):                       # 16: the fixed shape; others: the eager-shaped draft
        ours, theirs = run(static, prompt, block=block), run(eager, prompt, block=block)
        assert ours.tokens == theirs.tokens == plain.tokens, f"block {block}"
        assert ours.stats.accepted == theirs.stats.accepted


def test_static_drafts_equal_the_eager_drafters_step_by_step(pairs):
    """The same drafts (not only the same output): the static drafter computes what DraftRunner does."""
    eager, static = pairs
    prompt = prompt_of(40, seed=9)
    greedy = GenerationSettings(max_new_tokens=30, draft_cutoff=0.0)
    for pair in (eager, static):
        pair.log = []
    first = [p.prefill(prompt, greedy, True) for p in (eager, static)]
    assert first[0] == first[1]
    last, pos = first[0], len(prompt)
    for _ in range(6):
        drafts = [p.draft(last, pos, p.block_size) for p in (eager, static)]
        assert drafts[0] == drafts[1]
        outcomes = [p.verify(last, pos, drafts[0]) for p in (eager, static)]
        assert outcomes[0] == outcomes[1]
        n, last = outcomes[0]
        pos += n + 1
        for p in (eager, static):
            p.commit(pos)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("wrong_every", [0, 3, 1])   # all, some and no drafts accepted
def test_static_target_rolls_back_exactly_under_planted_acceptance(arch, wrong_every):
    eager = random_pair(arch, seed=5, **SIZES)
    static = static_of(eager, use_kernels=False)
    prompt = prompt_of(20, seed=1)
    ref = run(eager, prompt, n=40, baseline=True).tokens
    got = run(OraclePair(static, ref, wrong_every=wrong_every), prompt, n=40, block=16)
    assert got.tokens == ref
    if wrong_every == 0:
        assert got.stats.tau > 10
    if wrong_every == 1:
        assert got.stats.accepted == 0


def test_triton_kernels_in_the_static_steps_give_the_same_tokens():
    """The kernels inside the steps (TRITON_INTERPRET=1 on a CPU): device verification with the one read
    per step (PendingDrafts), the drafter's attention kernel."""
    if os.environ.get("TRITON_INTERPRET") != "1":    # on a GPU the cuda-only tests run the kernels in the steps
        pytest.skip("runs the kernels on CPU tensors, in Triton's interpreter")
    pytest.importorskip("triton")
    eager = random_pair("qwen3", seed=3, head_scale=4.0, **SIZES)
    static = static_of(eager, use_kernels=True)
    prompt = prompt_of(30, seed=2)
    plain = run(eager, prompt, n=16, baseline=True).tokens
    static.prefill(prompt, GenerationSettings(max_new_tokens=16, draft_cutoff=0.0), True)
    assert isinstance(static.draft(plain[0], len(prompt), 16), PendingDrafts)
    assert run(static, prompt, n=16, block=16).tokens == plain
    assert run(OraclePair(static, plain, wrong_every=4), prompt, n=16, block=16).tokens == plain


def test_static_mask_is_block_mask_over_the_whole_buffer():
    for window, causal in [(None, False), (None, True), (7, False), (7, True)]:
        for end, n in [(16, 16), (40, 16), (9, 1)]:
            full = static_mask(torch.tensor(end), n, 64, window, causal)
            expected = block_mask(end, n, window, causal)
            expected = torch.ones(n, end, dtype=torch.bool) if expected is None else expected
            assert torch.equal(full[:, :end], expected) and not full[:, end:].any()


def test_dense_full_attention_and_hybrid_targets_take_the_static_path():
    assert supported("qwen3") and supported("llama") and supported("qwen3_5")
    for eager_only in ("gpt_oss", "qwen3_moe", "qwen3_5_moe", "gemma4"):
        assert not supported(eager_only)


def test_steps_attend_over_the_rows_they_need_one_shape_per_bucket():
    eager = random_pair("qwen3", seed=3, **SIZES)
    static = static_of(eager, use_kernels=False)
    assert [static.static.rows(end, 64) for end in (1, 64, 65, 200, 316, 400)] == [64, 64, 128, 256, 316, 316]
    prompt = prompt_of(100, seed=4)
    dflash = run(static, prompt, n=60, block=16)        # positions 100..160: rows 128, then 192
    assert sorted(static.graph_status()) == ["16x128", "16x192", "draft"]
    plain = run(static, prompt, n=60, baseline=True)
    assert sorted(static.graph_status()) == ["16x128", "16x192", "1x128", "1x192", "draft"]
    assert dflash.tokens == plain.tokens == run(eager, prompt, n=60, baseline=True).tokens
    assert not any(captured for captured, _ in static.graph_status().values())     # no graphs on a CPU


def test_the_context_setting_sizes_the_caches_and_bounds_the_loop():
    eager = random_pair("qwen3", seed=3, **SIZES)
    static = static_of(eager, use_kernels=False)
    assert static.max_positions == static.info["max_positions"] == 300
    static.prefill(prompt_of(5), GenerationSettings(max_new_tokens=2), True)
    keys, _ = static.static.cache.layers[0]
    assert keys.shape[2] == 300 + static.block_size


cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (never in CI)")


def random_cuda_pair(arch, generation, dtype):
    """A random pair put on the GPU as load_pair puts one there: not through TorchPair, whose CPU tuning packs
    the target's weights for oneDNN (CPU tensors that Module.to does not move)."""
    target = random_target(arch, seed=3, **SIZES)
    with torch.no_grad():
        target.head.weight.mul_(4.0)
    drafter = random_drafter(target, seed=4, generation=generation, layers=1, block_size=16)
    target.model.to("cuda", dtype)
    target.device = torch.device("cuda")
    return CudaPair(target, drafter.placed("cuda", dtype), None, "random", arch, context=300)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch,generation", [("qwen3", 1), ("llama", 1), ("qwen3", 2), ("qwen3_5", 1), ("qwen3_5", 2)])
def test_cuda_graphs_give_plain_decodings_greedy_tokens(arch, generation, dtype):
    pair = random_cuda_pair(arch, generation, dtype)
    for seed in (4, 5, 6):
        prompt = prompt_of(50, seed=seed)
        plain = run(pair, prompt, n=40, baseline=True).tokens
        assert run(pair, prompt, n=40, block=16).tokens == plain, f"prompt {seed}"
    assert all(captured for captured, _ in pair.graph_status().values()), pair.graph_status()
    assert pair.memory()["reserved_bytes"] > 0


def test_cuda_memory_is_reported_on_cuda_only():
    from engine.stats import Stats, cuda_memory
    assert cuda_memory({"peak_bytes": 5}) == {"cuda_peak_bytes": None, "cuda_reserved_bytes": None}
    assert cuda_memory({"peak_bytes": 5, "reserved_bytes": 8}) == {"cuda_peak_bytes": 5, "cuda_reserved_bytes": 8}
    eager = random_pair("qwen3", seed=3, **SIZES)
    stats = run(eager, prompt_of(5), n=3).stats.to_dict()
    assert stats["cuda_peak_bytes"] is None and stats["cuda_reserved_bytes"] is None and stats["peak_memory_bytes"] > 0
