"""EAGLE-3 drafters in the MLX engine (on MLX's CPU device here): a random drafter in SpecForge's layout
(tests/tiny_torch.py random_eagle3) drafts in MLX exactly what it drafts in torch, step by step through an answer's
rejections (with a head over a subset of the vocabulary, and with both norm options); greedy output is plain
decoding's at every width; sampled drafts and their proposals are torch's given the same draws; a damaged d2t map
is refused by name."""
import json

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="the mlx engine needs mlx (pip install 'dflash-desktop[mlx]')")
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from engine.backends import load_pair  # noqa: E402
from engine.backends.torch.eagle3 import Eagle3Runner  # noqa: E402
from engine.bench import DEMO_DIR  # noqa: E402
from engine.errors import CheckpointError  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from tests.test_mlx_dspark import same_draws  # noqa: E402
from tests.tiny_torch import assert_greedy_at_every_width, lockstep, random_eagle3  # noqa: E402

TARGET = DEMO_DIR / "target"
PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"
CFG = json.loads((TARGET / "config.json").read_text())


def both(folder):
    tp = load_pair("torch", TARGET, folder, device="cpu", dtype="float32")
    tp.runner = Eagle3Runner(tp.drafter, tp.target.head.weight, torch.float32)   # no bfloat16 drafter on this CPU
    return tp, load_pair("mlx", TARGET, folder, device="cpu", dtype="float32")


@pytest.mark.parametrize("options", [{"draft_vocab": 1000},
                                     {"norm_before_residual": True, "norm_before_fc": True, "layers": [2, 4, 6]}])
def test_mlx_drafts_what_torch_drafts_step_by_step(tmp_path, options):
    tp, mp = both(random_eagle3(tmp_path / "e", CFG, options.pop("layers", [1, 3, 5]), scale=0.3, **options))
    assert mp.info["method"] == "eagle3" and mp.info["drafter_generation"] == 4 and mp.block_size == tp.block_size
    mp.prefill([5, 6, 7], GenerationSettings(), True)
    tp.prefill([5, 6, 7], GenerationSettings(), True)
    assert mp.draft_vocab == tp.draft_vocab == options.get("draft_vocab")   # its own head's tokens, for the stats
    steps = lockstep((tp, mp), tp.tokenizer.encode_prompt(PROMPT, raw=True),
                     GenerationSettings(max_new_tokens=30, draft_cutoff=0.0), steps=8)
    assert all(len(drafts) == tp.block_size - 1 for drafts in steps)


def test_greedy_eagle3_keeps_plain_decodings_tokens_at_every_width(tmp_path):
    _, mp = both(random_eagle3(tmp_path / "e", CFG, [1, 3, 5], scale=0.3))
    prompt = mp.tokenizer.encode_prompt(PROMPT, raw=True)
    assert_greedy_at_every_width(mp, prompt, "eagle3", widths=(2, 5, mp.block_size), accepting=False)


def test_sampled_drafts_and_their_proposal_are_torchs_given_the_same_draws(tmp_path, monkeypatch):
    """Both engines' categorical draws replaced by inverse-CDF draws of the same uniform numbers (same_draws): the
    same drafts, and the same proposal rows (torch's over the head's tokens, MLX's spread over the vocabulary)."""
    from engine.backends.mlx.sampling import Keys
    tp, mp = both(random_eagle3(tmp_path / "e", CFG, [1, 3, 5], scale=0.3, draft_vocab=1000))
    same_draws(monkeypatch)
    sampled = GenerationSettings(temperature=0.8)
    feats = np.random.default_rng(1).standard_normal((12, 3 * CFG["hidden_size"])).astype(np.float32)
    tokens = list(range(20, 32))
    tp.runner.reset()
    mp.drafter.reset()
    with torch.inference_mode(), mx.stream(mx.cpu):
        t_drafts, t_q, _ = tp.runner.propose(torch.from_numpy(feats), tokens, tp.target.embed, 6, sampled, None)
        m_drafts, m_q, _ = mp.drafter.propose(mx.array(feats), tokens, mp.target.embed, mp.target.head, 6, sampled,
                                              Keys(0), mp.target.vocab_rows)
    assert m_drafts.tolist() == t_drafts.tolist() and len(set(m_drafts.tolist())) > 1
    whole = np.zeros((6, CFG["vocab_size"]), dtype=np.float32)
    whole[np.arange(6)[:, None], t_q.ids.numpy()] = t_q.probs.numpy()
    np.testing.assert_allclose(np.array(m_q), whole, rtol=1e-3, atol=1e-6)


def test_a_damaged_d2t_map_is_refused_by_name(tmp_path):
    folder = random_eagle3(tmp_path / "e", CFG, [1, 3, 5], draft_vocab=100)
    weights = load_file(folder / "model.safetensors")
    save_file({**weights, "d2t": -torch.arange(100)}, folder / "model.safetensors")   # every row to token 0
    with pytest.raises(CheckpointError, match="two of them to one token"):
        load_pair("mlx", TARGET, folder, device="cpu", dtype="float32")
