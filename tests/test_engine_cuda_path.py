"""The CUDA path's step logic (engine/backends/torch/cuda.py: static caches, fixed-shape padded steps,
explicit positions, device verification) run on the CPU without graphs: greedy tokens identical to the
eager TorchPair and to plain decoding, on tiny random pairs (DFlash, DFlash2 and DSpark drafters, Qwen3, Llama and
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
from tests.tiny_torch import lockstep, random_drafter, random_pair, random_target
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


@pytest.fixture(scope="module", params=[("qwen3", 1), ("llama", 1), ("qwen3", 2), ("qwen3_5", 1), ("qwen3_5", 2),
                                        ("qwen3", 3), ("qwen3", 3, False)])   # DSpark from its anchor slot, after it
def pairs(request):
    """Both drafters in float32: drafts compared token for token need one rounding (on a CPU with native
    bfloat16 TorchPair would draft in bfloat16, where the padded static shapes round differently)."""
    arch, generation, *anchor = request.param
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu, "draft_dtype", lambda: None)
        eager = random_pair(arch, seed=3, generation=generation, head_scale=4.0,
                            draft_options={"sample_from_anchor": anchor[0]} if anchor else None, **SIZES)
        return eager, static_of(eager, use_kernels=False)


@pytest.mark.parametrize("prompt_len", [1, 17, 130])
def test_static_steps_give_the_eager_engines_greedy_tokens(pairs, prompt_len):
    eager, static = pairs
    prompt = prompt_of(prompt_len, seed=prompt_len)
    plain = run(eager, prompt, baseline=True)
    assert run(static, prompt, baseline=True).tokens == plain.tokens
    for block in (2, 5, static.block_size):        # the fixed shape (16, DSpark's 17); others: the eager-shaped draft
        ours, theirs = run(static, prompt, block=block), run(eager, prompt, block=block)
        assert ours.tokens == theirs.tokens == plain.tokens, f"block {block}"
        assert ours.stats.accepted == theirs.stats.accepted


def test_static_drafts_equal_the_eager_drafters_step_by_step(pairs):
    """The same drafts (not only the same output): the static drafter computes what DraftRunner does."""
    lockstep(pairs, prompt_of(40, seed=9), GenerationSettings(max_new_tokens=30, draft_cutoff=0.0))


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


@pytest.mark.parametrize("path", ["eager", "static"])
def test_steps_after_the_prompt_never_take_flash_linear_attentions_kernels(monkeypatch, path):
    """With flash-linear-attention installed transformers puts its kernels behind the delta rule's names;
    in bfloat16 its chunked and recurrent forms part a verify from a plain step (seen on an H100). fla needs
    a GPU, so stand-ins take those names here, as transformers' wrapper does (the torch function reachable
    through __wrapped__), and count their calls: the prefill may use them, no later step does."""
    import functools

    import transformers.models.qwen3_5.modeling_qwen3_5 as modeling
    calls = []
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        @functools.wraps(getattr(modeling, name))
        def kernel(*args, _name=name, _torch=getattr(modeling, name), **kwargs):
            calls.append(_name)
            return _torch(*args, **kwargs)
        monkeypatch.setattr(modeling, name, kernel)
    eager = random_pair("qwen3_5", seed=5, **SIZES)
    pair = eager if path == "eager" else static_of(eager, use_kernels=False)
    greedy = GenerationSettings(max_new_tokens=30, draft_cutoff=0.0)
    last, pos = pair.prefill(prompt_of(20, seed=3), greedy, True), 20
    assert calls                                       # the prefill went through the (stand-in) kernels
    calls.clear()
    for step in range(6):
        if step % 2:                                   # a plain step
            _, last = pair.verify(last, pos, [])
            pos += 1
        else:
            drafts = pair.draft(last, pos, pair.block_size)
            n, last = pair.verify(last, pos, list(drafts))
            pos += n + 1
        pair.commit(pos)
    assert calls == []


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


def dense_and_layered(arch, **kwargs):
    """The same target over a StaticKV twice: through DenseDecoder and through transformers' layers."""
    from engine.backends.torch.cuda import StaticTarget
    eager = random_pair(arch, seed=7, **SIZES)
    return eager, StaticTarget(eager.target, 316, **kwargs), StaticTarget(eager.target, 316, dense=False)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_dense_decoder_computes_what_transformers_layers_do(arch):
    """Logits and captured features of a prefill, a verify-sized and a one-token step, and the cache rows
    they leave, against transformers' own layers over the same kind of cache."""
    eager, dense, layered = dense_and_layered(arch)
    assert dense.dense is not None and layered.dense is None
    with torch.inference_mode():
        for start, width in [(0, 37), (37, 16), (45, 1), (46, 16)]:     # the verify at 37 kept 8 of 16
            ids = torch.tensor([prompt_of(width, seed=start)])
            outs = []
            for static in (dense, layered):
                static.cache.start.fill_(start)
                outs.append(static.run(ids, True, verifying=width > 1, rows=64))
            (dense_logits, dense_feats), (logits, feats) = outs
            torch.testing.assert_close(dense_logits, logits, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(dense_feats, feats, atol=1e-5, rtol=1e-5)
        for i in range(len(eager.target.layers)):
            for ours, theirs in zip(dense.cache.layers[i], layered.cache.layers[i]):
                torch.testing.assert_close(ours[:, :, :62], theirs[:, :, :62], atol=1e-5, rtol=1e-5)


def test_dense_decoders_joined_weights_share_the_models_memory():
    """Q/K/V and gate/up joined into one matrix each, with the model's own parameters turned into views of
    it (a copy would cost an 8B model gigabytes), and the model still computes as before."""
    from engine.backends.torch.cuda import StaticTarget
    eager, dense, layered = dense_and_layered("qwen3")
    attn, mlp = eager.target.layers[0].self_attn, eager.target.layers[0].mlp
    qkv, gate_up = dense.dense.layers[0].before[1], dense.dense.layers[0].after[3]
    assert attn.q_proj.weight.data_ptr() == qkv.data_ptr()
    assert attn.k_proj.weight.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == gate_up.untyped_storage().data_ptr()
    again = StaticTarget(eager.target, 316)                       # a second decoder joins without a copy
    assert again.dense.layers[0].before[1].data_ptr() == qkv.data_ptr()
    assert again.dense.layers[0].after[3].data_ptr() == gate_up.data_ptr()
    ids, fresh = torch.tensor([prompt_of(9)]), random_pair("qwen3", seed=7, **SIZES)
    with torch.inference_mode():
        torch.testing.assert_close(eager.target.forward(ids)[0], fresh.target.forward(ids)[0])


def test_dense_decoder_keeps_the_biases_of_llama_layers_that_have_them():
    from transformers import AutoModelForCausalLM

    from engine.backends.torch.cuda import StaticTarget
    from engine.backends.torch.target import TargetModel
    from tests.tiny_torch import target_config
    cfg = target_config("llama", vocab=256, hidden=64, layers=2)
    cfg.attention_bias = cfg.mlp_bias = True
    torch.manual_seed(2)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_()                         # transformers starts biases at zero
    target = TargetModel(model, (0, 1))
    dense, layered = StaticTarget(target, 80), StaticTarget(target, 80, dense=False)
    ids = torch.tensor([prompt_of(20)])
    with torch.inference_mode():
        ours, theirs = dense.run(ids, True, rows=80), layered.run(ids, True, rows=80)
    assert dense.dense.layers[0].before[2] is not None
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours[1], theirs[1], atol=1e-5, rtol=1e-5)


def test_dense_decoder_in_bfloat16_rounds_as_transformers_layers_do():
    """Its norms round where transformers' do, so a bfloat16 target gives the same numbers either way (on
    this CPU bit for bit), and its answers are the model's, not only equal to our own plain decoding."""
    from engine.backends.torch.cuda import StaticTarget
    target = random_target("qwen3", seed=7, capture_layers=(1, 2), **SIZES)
    with torch.no_grad():
        for name, param in target.model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)             # transformers starts them at one, which hides rounding
    target.model.to(torch.bfloat16)
    dense, layered = StaticTarget(target, 316), StaticTarget(target, 316, dense=False)
    ids = torch.tensor([prompt_of(30)])
    with torch.inference_mode():
        (logits, feats), (want_logits, want_feats) = dense.run(ids, True, rows=64), layered.run(ids, True, rows=64)
    assert torch.equal(logits, want_logits) and torch.equal(feats, want_feats)


def test_compiled_dense_decoder_computes_the_same():
    """torch.compile'd halves of each layer (the benchmark's fused variant), here on the CPU's backend."""
    _, compiled, layered = dense_and_layered("qwen3", compiled=True)
    with torch.inference_mode():
        for start, width in [(0, 20), (20, 16), (36, 1)]:
            ids = torch.tensor([prompt_of(width, seed=start)])
            outs = []
            for static in (compiled, layered):
                static.cache.start.fill_(start)
                outs.append(static.run(ids, True, rows=64))
            torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)


def test_a_failing_compiler_leaves_the_same_steps_uncompiled(monkeypatch):
    def compiler_that_fails(fn, **options):
        def compiled(*args):
            raise RuntimeError("no C compiler on this machine")
        return compiled
    monkeypatch.setattr(torch, "compile", compiler_that_fails)
    _, compiled, layered = dense_and_layered("qwen3", compiled=True)
    ids = torch.tensor([prompt_of(12)])
    with torch.inference_mode():
        ours, theirs = compiled.run(ids, True, rows=64), layered.run(ids, True, rows=64)
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-5)
    assert "no C compiler" in compiled.dense.why_not


def test_warm_up_captures_the_usual_steps_and_changes_no_answer():
    eager = random_pair("qwen3", seed=3, **SIZES)
    static = static_of(eager, use_kernels=False)
    static.warm_up()
    assert {"1x64", "16x64", "draft"} <= set(static.graph_status())
    prompt = prompt_of(30, seed=8)
    plain = run(eager, prompt, baseline=True).tokens
    assert run(static, prompt, block=16).tokens == run(static, prompt, baseline=True).tokens == plain


def test_only_dense_full_attention_targets_take_the_dense_decoder():
    from engine.backends.torch.dense_decoder import fits
    assert fits(random_target("qwen3", seed=1, **SIZES)) and fits(random_target("llama", seed=1, **SIZES))
    assert not fits(random_target("qwen3_5", seed=1, **SIZES))          # DeltaNet layers
    quantized = random_target("qwen3", seed=1, **SIZES)
    quantized.quantization = "nf4"
    assert not fits(quantized)
    silu_free = random_target("llama", seed=1, **SIZES)
    silu_free.model.config.hidden_act = "gelu"
    assert not fits(silu_free)
    rescaled = random_target("llama", seed=1, **SIZES)       # dynamic NTK: angles follow the length seen
    rescaled.decoder.rotary_emb.rope_type = "dynamic"
    assert not fits(rescaled)


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


@cuda_only
def test_cuda_graphs_over_the_compiled_dense_decoder_give_plain_decodings_greedy_tokens():
    target = random_target("qwen3", seed=3, **SIZES)
    with torch.no_grad():
        target.head.weight.mul_(4.0)
    drafter = random_drafter(target, seed=4, layers=1, block_size=16)
    target.model.to("cuda", torch.bfloat16)
    target.device = torch.device("cuda")
    pair = CudaPair(target, drafter.placed("cuda", torch.bfloat16), None, "random", "qwen3", context=300, compiled=True)
    pair.warm_up()                                   # as load_pair does: compiled and captured before answers
    assert all(captured for captured, _ in pair.graph_status().values()) and pair.static.dense.why_not is None
    prompt = prompt_of(50, seed=4)
    plain = run(pair, prompt, n=40, baseline=True).tokens
    assert run(pair, prompt, n=40, block=16).tokens == plain
    assert all(captured for captured, _ in pair.graph_status().values()), pair.graph_status()


def test_cuda_memory_is_reported_on_cuda_only():
    from engine.stats import cuda_memory
    assert cuda_memory({"peak_bytes": 5}) == {"cuda_peak_bytes": None, "cuda_reserved_bytes": None}
    assert cuda_memory({"peak_bytes": 5, "reserved_bytes": 8}) == {"cuda_peak_bytes": 5, "cuda_reserved_bytes": 8}
    eager = random_pair("qwen3", seed=3, **SIZES)
    stats = run(eager, prompt_of(5), n=3).stats.to_dict()
    assert stats["cuda_peak_bytes"] is None and stats["cuda_reserved_bytes"] is None and stats["peak_memory_bytes"] > 0
