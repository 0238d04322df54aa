"""DFlash2 drafters in the MLX engine (on MLX's CPU device here): the public checkpoint loads by name, the MLX
drafter computes what the torch one does (hidden states, candidates, the selector's path and distributions),
greedy decoding keeps plain decoding's tokens for every block size, and sampling follows the target's
distribution with the selector's proposal (zero outside each row's candidates)."""
import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="the mlx engine needs mlx (pip install 'dflash-desktop[mlx]')")
import torch  # noqa: E402

from engine.backends import load_pair  # noqa: E402
from engine.backends.torch.draft2_runner import Draft2Runner  # noqa: E402
from engine.errors import CheckpointError  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402
from tests.test_engine_dflash2 import (HIDDEN, TARGET_LAYERS, VOCAB, public_config,  # noqa: E402
                                       write_public_checkpoint)
from tests.tiny_torch import random_drafter, random_target  # noqa: E402


def save_target(folder, arch: str = "qwen3", seed: int = 7, head_scale: float = 8.0, **sizes):
    """A random torch target in the Hugging Face layout (which mlx-lm reads), its head sharpened so that
    some random drafts are accepted."""
    sizes = {"vocab": VOCAB, "hidden": HIDDEN, "layers": TARGET_LAYERS, "max_positions": 512, **sizes}
    target = random_target(arch, seed=seed, **sizes)
    with torch.no_grad():
        target.head.weight.mul_(head_scale)
    target.model.save_pretrained(folder)
    return target


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def pairs(request, tmp_path_factory):
    """The same folders in both engines; the drafter scales its block's embedding (input_embedding_scale)."""
    root = tmp_path_factory.mktemp(f"dflash2-{request.param}")
    save_target(root / "target", request.param)
    write_public_checkpoint(root / "draft", seed=3, config=public_config(input_embedding_scale=0.7))
    tp = load_pair("torch", root / "target", root / "draft", device="cpu", dtype="float32")
    tp.runner = Draft2Runner(tp.drafter, tp.target.head.weight, torch.float32)   # no bfloat16 drafter on this CPU
    mp = load_pair("mlx", root / "target", root / "draft", device="cpu", dtype="float32")
    return tp, mp, root


def settings(**kwargs):
    return GenerationSettings(**{"max_new_tokens": 40, "draft_cutoff": 0.0, "plain_fallback": False, **kwargs})


def test_the_pair_loads_as_dflash2(pairs):
    _, mp, _ = pairs
    assert mp.drafter.config.input_embedding_scale == 0.7
    assert mp.drafter.generation == 2 and mp.info["drafter_generation"] == 2
    assert mp.info["method"] == "dflash2" and mp.info["methods"] == ["none", "ngram", "dflash2"]
    assert mp.vocab is None      # the candidate selector scores every token


def test_the_mlx_drafter_proposes_what_the_torch_drafter_does(pairs):
    """Two draft passes over a growing context (the second at later rotary positions, a block wider than the
    sliding window): the same hidden states, the same path through the same candidates, the same selector
    distributions."""
    tp, mp, _ = pairs
    feats = np.random.default_rng(0).standard_normal((30, tp.drafter.fc.in_features)).astype(np.float32)
    mask = tp.drafter.config.mask_token_id
    tp.runner.reset()
    mp.drafter.reset()
    greedy = GenerationSettings()
    with torch.inference_mode(), mx.stream(mx.cpu):
        for ctx, anchor, width in ((slice(0, 20), 5, 8), (slice(20, None), 11, 16)):
            block = [anchor] + [mask] * (width - 1)
            t_hidden = tp.runner.hidden(tp.target.embed(torch.tensor(block)), torch.from_numpy(feats[ctx]))[1:]
            m_hidden = mp.drafter.hidden(mp.target.embed(mx.array(block)), mx.array(feats[ctx]))[1:]
            np.testing.assert_allclose(np.array(m_hidden), t_hidden.numpy(), rtol=1e-4, atol=1e-4)
            t_drafts, _, t_rows = tp.runner.propose_from(t_hidden, anchor, greedy, None)
            m_drafts, m_candidates, m_rows = mp.drafter.propose(m_hidden, mp.target.head(m_hidden), anchor, greedy,
                                                                None)
            assert m_drafts.tolist() == t_drafts.tolist()
            np.testing.assert_allclose(np.array(m_rows), t_rows.numpy(), rtol=1e-3, atol=1e-5)
            assert m_candidates.shape == (width - 1, mp.drafter.config.dflash2.selector_top_k)


def test_greedy_dflash2_keeps_plain_decodings_tokens_for_every_block_size(pairs):
    """And the torch engine's tokens and acceptance, step by step, at the checkpoint's block size (which holds the
    embedding scale to torch's), and with the drafter's linear layers quantized to 4 bits."""
    tp, mp, root = pairs
    prompt = torch.randint(1, VOCAB - 1, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = Generation(mp, prompt, settings(), baseline=True).run().tokens
    accepted = 0
    for block in (4, 7, 11, 16):
        run = Generation(mp, prompt, settings(block_size=block)).run()
        assert run.tokens == ref, f"block size {block} diverged from plain decoding"
        assert run.stats.drafted == run.stats.steps * (block - 1)
        accepted += run.stats.accepted
    assert accepted > 0, "no draft was ever accepted: the partial-acceptance paths did not run"
    torch_run = Generation(tp, prompt, settings()).run()
    mlx_run = Generation(mp, prompt, settings()).run()
    assert mlx_run.tokens == torch_run.tokens == ref
    assert mlx_run.stats.acceptance_lengths == torch_run.stats.acceptance_lengths
    from engine.backends.mlx.engine import load_pair as load_mlx
    quantized = load_mlx(root / "target", root / "draft", device="cpu", dtype="float32", draft_bits=4)
    assert "drafter" in quantized.info["quantized"]
    assert Generation(quantized, prompt, settings()).run().tokens == ref


def test_a_sampled_path_and_its_proposal_are_torchs_given_the_same_draws(pairs, monkeypatch):
    """At temperature 0.7, with both engines' uniform draws replaced by the same numbers: the same path, the same
    selector distributions, and the dense proposal the MLX engine verifies with is torch's Candidates row."""
    tp, mp, _ = pairs
    from engine.backends.mlx.sampling import Keys
    draws = np.random.default_rng(5).random(32).astype(np.float32)
    monkeypatch.setattr(mx.random, "uniform", lambda shape, key=None, **_: mx.array(draws[:shape[0]]))
    monkeypatch.setattr(torch, "rand", lambda n, generator=None, device=None: torch.from_numpy(draws[:n].copy()))
    sampled = GenerationSettings(temperature=0.7, draft_cutoff=0.0)
    feats = np.random.default_rng(1).standard_normal((12, tp.drafter.fc.in_features)).astype(np.float32)
    block = [9] + [tp.drafter.config.mask_token_id] * 15
    tp.runner.reset()
    mp.drafter.reset()
    with torch.inference_mode(), mx.stream(mx.cpu):
        t_hidden = tp.runner.hidden(tp.target.embed(torch.tensor(block)), torch.from_numpy(feats))[1:]
        t_drafts, t_q, t_rows = tp.runner.propose_from(t_hidden, 9, sampled, None)
        m_hidden = mp.drafter.hidden(mp.target.embed(mx.array(block)), mx.array(feats))[1:]
        mp._settings, mp._keys, mp._cutoff = sampled, Keys(0), 0.0
        m_drafts = mp._draft_path(m_hidden, 9)
    assert m_drafts == t_drafts.tolist() and len(set(m_drafts)) > 1
    q = np.array(mp._q)
    for n in range(len(m_drafts)):
        np.testing.assert_allclose(q[n], t_q.row(n, q.shape[1]).numpy(), rtol=1e-3, atol=1e-6)


def test_a_cutoff_verifies_a_confident_prefix_and_keeps_the_tokens(pairs):
    _, mp, _ = pairs
    prompt = list(range(3, 25))
    ref = Generation(mp, prompt, settings(), baseline=True).run().tokens
    cut = Generation(mp, prompt, settings(draft_cutoff=0.3)).run()
    assert cut.tokens == ref
    assert cut.stats.drafted < cut.stats.steps * 15, "a cutoff of 0.3 should shorten some drafts"


@pytest.mark.parametrize("temperature, top_k, top_p, cutoff", [(1.0, 0, 1.0, 0.0), (0.7, 3, 0.9, 0.3)])
def test_dflash2_samples_follow_the_target_distribution(tmp_path, temperature, top_k, top_p, cutoff):
    """The selector proposes 4 of 6 tokens per slot, each conditioned on the draft before it: the answers'
    distribution is the target's (chi-square against the exact one, enumerated)."""
    from tests.test_mlx_sampling import assert_follows_the_target
    sizes = dict(vocab=6, hidden=32, layers=2, heads=2, kv_heads=1)
    target = save_target(tmp_path / "target", seed=11, head_scale=6.0, **sizes)
    random_drafter(target, seed=12, generation=2, layers=1, block_size=4, top_k=4, rank=4, group=8, heads=2,
                   kv_heads=1).save_pretrained(tmp_path / "draft")
    pair = load_pair("mlx", tmp_path / "target", tmp_path / "draft", device="cpu", dtype="float32")
    assert pair.drafter.generation == 2
    assert_follows_the_target(pair, GenerationSettings(max_new_tokens=3, temperature=temperature, top_k=top_k,
                                                       top_p=top_p, block_size=4, draft_cutoff=cutoff))


def test_a_missing_tensor_is_named_and_the_other_class_refuses(tmp_path):
    from engine.backends.mlx.drafter import MlxDrafter
    from engine.backends.mlx.drafter2 import MlxDrafter2
    write_public_checkpoint(tmp_path / "draft", drop="layers.0.attention_conv.kernel_projection.weight")
    with pytest.raises(CheckpointError, match=r"lack 1 tensors \(first: layers.0.attention_conv.kernel_projection"):
        MlxDrafter2.from_pretrained(tmp_path / "draft")
    write_public_checkpoint(tmp_path / "whole")
    with pytest.raises(CheckpointError, match="generation 2 drafter, which MlxDrafter does not load"):
        MlxDrafter.from_pretrained(tmp_path / "whole")
