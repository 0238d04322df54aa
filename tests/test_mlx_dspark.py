"""DSpark drafters in the MLX engine (on MLX's CPU device here): the demo's DFlash drafter with a random Markov head
(tests/tiny_torch.py dspark_from) drafts in MLX exactly what it drafts in torch, step by step, in both block layouts
(from the anchor slot, DeepSpec's; after it, speculators'); greedy output is plain decoding's at every width; sampled
drafts and their proposals are torch's given the same draws; and answers follow the target's distribution."""
import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="the mlx engine needs mlx (pip install 'dflash-desktop[mlx]')")
import torch  # noqa: E402

from engine.backends import load_pair  # noqa: E402
from engine.backends.torch.dspark import DSparkRunner  # noqa: E402
from engine.bench import DEMO_DIR  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from tests.test_mlx_dflash2 import save_target  # noqa: E402
from tests.tiny_torch import assert_greedy_at_every_width, dspark_from, lockstep, random_drafter  # noqa: E402

TARGET, DRAFT = DEMO_DIR / "target", DEMO_DIR / "draft"
PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"


@pytest.fixture(scope="module", params=[True, False], ids=["from-anchor", "after-anchor"])
def pairs(request, tmp_path_factory):
    folder = dspark_from(DRAFT, tmp_path_factory.mktemp("dspark") / "draft", scale=0.3,
                         sample_from_anchor=request.param)
    tp = load_pair("torch", TARGET, folder, device="cpu", dtype="float32")
    tp.runner = DSparkRunner(tp.drafter, tp.target.head.weight, torch.float32)   # no bfloat16 drafter on this CPU
    mp = load_pair("mlx", TARGET, folder, device="cpu", dtype="float32")
    return tp, mp


def test_mlx_drafts_what_torch_drafts_step_by_step(pairs):
    tp, mp = pairs
    assert mp.info["method"] == "dspark" and mp.info["drafter_generation"] == 3 and mp.block_size == tp.block_size
    steps = lockstep((tp, mp), tp.tokenizer.encode_prompt(PROMPT, raw=True),
                     GenerationSettings(max_new_tokens=30, draft_cutoff=0.0))
    assert all(len(drafts) == tp.block_size - 1 for drafts in steps)


def test_greedy_dspark_keeps_plain_decodings_tokens_at_every_width(pairs):
    _, mp = pairs
    prompt = mp.tokenizer.encode_prompt(PROMPT, raw=True)
    assert_greedy_at_every_width(mp, prompt, "dspark", widths=(2, 5, mp.block_size), accepting=False)


def same_draws(monkeypatch) -> None:
    """Both engines' categorical draws (their sampling.draw) replaced by inverse-CDF draws of the same uniform
    numbers, taken in turn by each engine."""
    from engine.backends.mlx import sampling as mlx_sampling
    from engine.backends.torch import sampling as torch_sampling
    draws = list(np.random.default_rng(5).random(64))
    taken = {"torch": 0, "mlx": 0}

    def inverse(probs, which):
        x = draws[taken[which]]
        taken[which] += 1
        return int(np.searchsorted(np.cumsum(np.asarray(probs, dtype=np.float64)[0]), x * float(np.sum(probs))))
    monkeypatch.setattr(torch_sampling, "draw", lambda q, gen: torch.tensor([inverse(q.numpy(), "torch")]))
    monkeypatch.setattr(mlx_sampling, "draw", lambda q, keys: mx.array([inverse(np.array(q), "mlx")]))


def test_sampled_drafts_and_their_proposal_are_torchs_given_the_same_draws(pairs, monkeypatch):
    """Both engines' categorical draws replaced by inverse-CDF draws of the same uniform numbers: the same drafts,
    and the same proposal rows (torch's [m, V], MLX's spread over the vocabulary)."""
    tp, mp = pairs
    from engine.backends.mlx.sampling import Keys
    same_draws(monkeypatch)
    sampled = GenerationSettings(temperature=0.8)
    feats = np.random.default_rng(1).standard_normal((12, tp.drafter.fc.in_features)).astype(np.float32)
    cfg = tp.drafter.config
    block = [9] + [cfg.mask_token_id] * (cfg.input_width(9) - 1)
    tp.runner.reset()
    mp.drafter.reset()
    with torch.inference_mode(), mx.stream(mx.cpu):
        t_drafts, t_q, _ = tp.runner.propose(tp.target.embed(torch.tensor(block)), torch.from_numpy(feats), 9,
                                             sampled, None)
        hidden = mp.drafter.hidden(mp.target.embed(mx.array(block)), mx.array(feats))[cfg.first_draft:]
        m_drafts, m_q, _ = mp.drafter.propose(mp.target.head(hidden), 9, sampled, Keys(0))
    assert m_drafts.tolist() == t_drafts.tolist() and len(set(m_drafts.tolist())) > 1
    np.testing.assert_allclose(np.array(m_q), t_q.numpy(), rtol=1e-3, atol=1e-6)


def test_dspark_samples_follow_the_target_distribution(tmp_path):
    """In speculators' layout (drafts after the last token; DeepSpec's is tests/test_engine_dspark.py's)."""
    from tests.test_mlx_sampling import assert_follows_the_target
    sizes = dict(vocab=6, hidden=32, layers=2, heads=2, kv_heads=1)
    target = save_target(tmp_path / "target", seed=11, head_scale=6.0, **sizes)
    drafter = random_drafter(target, seed=12, generation=3, layers=1, block_size=4, rank=4, heads=2, kv_heads=1,
                             sample_from_anchor=False)
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.mul_(20.0)
    drafter.save_pretrained(tmp_path / "draft", dtype=torch.float32)
    pair = load_pair("mlx", tmp_path / "target", tmp_path / "draft", device="cpu", dtype="float32")
    assert pair.drafter.generation == 3 and pair.block_size == 4
    assert_follows_the_target(pair, GenerationSettings(max_new_tokens=3, temperature=0.8, block_size=4,
                                                       draft_cutoff=0.3))
