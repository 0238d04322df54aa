"""The same weights on the MLX and torch engines, both in float32 on the CPU: the same greedy tokens, the
same target features, and our MLX drafter's logits equal to our torch drafter's, so the MLX drafter is
checked against the torch one (a wrong drafter would still be lossless; only these checks and the demo
pair's acceptance show it).

Folders come from the torch engine's tiny.py (Hugging Face layout, which mlx-lm reads). transformers 5
writes mixture-of-experts weights in a layout mlx-lm 0.32 does not read (hub checkpoints keep the old
one), so the MoE architectures are held to mlx-lm's own generate in test_mlx_architectures instead."""
import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="the mlx engine needs mlx (pip install 'dflash-desktop[mlx]')")
import torch  # noqa: E402

from engine.backends import load_pair  # noqa: E402
from engine.backends.torch.draft_runner import DraftRunner  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402

DENSE = ["qwen3", "llama", "qwen3_5"]
PROMPTS = ["def speculative(decoding):\n    return", "The quick brown fox jumps over the lazy dog. " * 3]


@pytest.fixture(scope="module", params=DENSE)
def pairs(request, tmp_path_factory):
    from tests.tiny_torch import save_random_pair
    target, draft = save_random_pair(tmp_path_factory.mktemp(request.param), arch=request.param, block_size=8,
                                     layers=4)
    tp = load_pair("torch", target, draft, device="cpu", dtype="float32")
    tp.runner = DraftRunner(tp.drafter, tp.target.head.weight, torch.float32)   # no bfloat16 drafter on this CPU
    mp = load_pair("mlx", target, draft, device="cpu", dtype="float32")
    return tp, mp


def settings(**kwargs):
    return GenerationSettings(**{"max_new_tokens": 40, "draft_cutoff": 0.0, "plain_fallback": False, **kwargs})


@pytest.mark.parametrize("text", PROMPTS)
def test_same_greedy_tokens_on_both_engines(pairs, text):
    tp, mp = pairs
    ids = tp.tokenizer.encode_prompt(text, raw=True)
    assert mp.tokenizer.encode_prompt(text, raw=True) == ids
    torch_run = Generation(tp, ids, settings()).run()
    mlx_run = Generation(mp, ids, settings()).run()
    mlx_plain = Generation(mp, ids, settings(), baseline=True).run()
    assert mlx_run.tokens == torch_run.tokens == mlx_plain.tokens
    assert mlx_run.stats.acceptance_lengths == torch_run.stats.acceptance_lengths


def test_the_mlx_drafter_computes_what_the_torch_drafter_does(pairs):
    """Features of the prompt, then two draft passes (the second over a growing context cache, at later
    rotary positions): the same numbers on both engines."""
    tp, mp = pairs
    ids = tp.tokenizer.encode_prompt(PROMPTS[0], raw=True)
    tp.prefill(ids, settings(), True)
    mp.prefill(ids, settings(), True)
    t_feats, m_feats = tp.answer.context[0], mp._context[0]
    np.testing.assert_allclose(np.array(m_feats), t_feats.numpy(), rtol=1e-4, atol=1e-4)
    mask, cut = tp.drafter.config.mask_token_id, len(ids) - 4
    tp.runner.reset()
    mp.drafter.reset()
    with torch.inference_mode(), mx.stream(mx.cpu):
        for ctx, first in ((slice(0, cut), ids[cut]), (slice(cut, None), 7)):
            block = [first] + [mask] * 7
            t_logits = tp.runner.logits(tp.target.embed(torch.tensor(block)), t_feats[ctx])
            m_logits = mp.target.head(mp.drafter.hidden(mp.target.embed(mx.array(block)), m_feats[ctx])[1:])
            np.testing.assert_allclose(np.array(m_logits), t_logits.numpy(), rtol=1e-3, atol=1e-4)


def test_the_demo_pair_accepts_as_much_on_mlx_as_on_torch():
    """The demo's trained drafter: the same tokens, and the same number of drafts accepted step by step (up
    to a rare near-tie), on a held-out prompt."""
    from engine.bench import DEMO_DIR, demo_prompts
    tp = load_pair("torch", DEMO_DIR / "target", DEMO_DIR / "draft", device="cpu", dtype="float32")
    tp.runner = DraftRunner(tp.drafter, tp.target.head.weight, torch.float32)
    mp = load_pair("mlx", DEMO_DIR / "target", DEMO_DIR / "draft", device="cpu", dtype="float32")
    ids = tp.tokenizer.encode_prompt(demo_prompts(limit=1)[0][1], raw=True)
    torch_run = Generation(tp, ids, settings(max_new_tokens=64)).run()
    mlx_run = Generation(mp, ids, settings(max_new_tokens=64)).run()
    assert mlx_run.tokens == torch_run.tokens
    assert torch_run.stats.tau > 1.5, "the demo drafter should accept drafts on held-out code"
    same = sum(a == b for a, b in zip(mlx_run.stats.acceptance_lengths, torch_run.stats.acceptance_lengths))
    assert same >= 0.9 * len(torch_run.stats.acceptance_lengths)
    assert abs(mlx_run.stats.tau - torch_run.stats.tau) < 0.1 * torch_run.stats.tau
