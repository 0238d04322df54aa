"""The frequency-ranked draft vocabulary (engine/draft_vocab.py): a deterministic ranking checked against its
target, shipped beside both pairs' drafters, and a drafter that proposes only from it while the output stays
exactly the target's: greedy identity on every architecture's stand-in and on the demo pair, exact sampling by
the chi-square test."""
from __future__ import annotations

import json

import pytest
import torch

import assets
from engine import draft_vocab
from engine.draft_vocab import DraftVocab
from engine.errors import CheckpointError
from engine.limits import GenerationSettings
from engine.loop import Generation
from tests.test_engine_sampling import VOCAB, assert_follows_the_target
from tests.tiny_torch import VARIANTS, random_pair


def test_the_ranking_is_by_count_then_id_with_end_of_turn_tokens_first():
    vocab, counted = draft_vocab.rank([[5, 3, 3, 9], [5, 5, 7, 3]], 10, first=[9, 9])
    assert vocab.ranked == (9, 3, 5, 7) and counted == 8      # 5 and 3 both thrice: the lower id first
    assert vocab.top(2) == (9, 3) and vocab.top(100) == (9, 3, 5, 7)   # past the ranking: every ranked token
    assert vocab.top(0) is None and vocab.top(None) is None
    whole, _ = draft_vocab.rank([[0, 1, 2]], 3)
    assert whole.top(3) is None and whole.top(2) == (0, 1)        # every token ranked: the whole vocabulary


@pytest.mark.parametrize("data, words", [
    ("not json", "cannot be read"),
    ({"format": 1, "vocab_size": 8, "ranked": [1, 2]}, "another model"),
    ({"format": 1, "vocab_size": 10, "ranked": [1, 10]}, "outside 0..9"),
    ({"format": 1, "vocab_size": 10, "ranked": [1, 2, 1]}, "twice"),
    ({"format": 1, "vocab_size": 10, "ranked": [1, True]}, "outside 0..9"),
    ({"format": 1, "vocab_size": 10}, "cannot be read"),
])
def test_a_bad_ranking_is_refused_by_name_with_what_to_do(tmp_path, data, words):
    (tmp_path / draft_vocab.FILE).write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(CheckpointError) as err:
        draft_vocab.load(tmp_path, 10)
    assert words in str(err.value) and draft_vocab.FILE in str(err.value)
    assert "Delete" in str(err.value) or "Rebuild" in str(err.value)


def test_a_drafter_without_a_ranking_drafts_over_every_token(tmp_path):
    assert draft_vocab.load(tmp_path, 10) is None


@pytest.mark.parametrize("pair_id", ["demo", "chat"])
def test_both_pairs_ship_a_ranking_of_their_targets_tokens_counted_on_training_material(pair_id):
    from engine.tokenizer import ChatTokenizer
    target = assets.path("demo", "target") if pair_id == "demo" else None
    size = 4096 if pair_id == "demo" else 49152
    vocab = draft_vocab.load(assets.path(pair_id, "draft"), size)
    assert vocab is not None and "training" in vocab.corpus
    if target is not None:
        assert vocab.ranked[0] in ChatTokenizer.from_folder(target).eos_ids
    else:
        assert vocab.ranked[0] == 2               # SmolLM2's <|im_end|>: every answer ends with it
    assert 1000 < len(vocab.ranked) <= size


def test_the_code_pairs_ranking_is_rebuilt_exactly_from_its_corpus():
    """Deterministic: counting the demo target's training files again gives the shipped file's ranking (where this
    Python's standard library is the one it was counted on)."""
    import sys

    from scripts import build_draft_vocab
    shipped = draft_vocab.load(assets.path("demo", "draft"), 4096)
    if f"Python {sys.version.split()[0]} " not in shipped.corpus:
        pytest.skip(f"the ranking was counted on another Python's standard library ({shipped.corpus})")
    rebuilt, counted = build_draft_vocab.demo()
    assert rebuilt == shipped and counted > 2_000_000


@pytest.fixture(scope="module", params=list(VARIANTS))
def ranked_pair(request):
    """A stand-in of each architecture whose drafter ranks its 256 tokens in a random order."""
    order = torch.randperm(256, generator=torch.Generator().manual_seed(7)).tolist()
    return random_pair(request.param, seed=3, vocab=256, hidden=64, layers=6, max_positions=512,
                       draft_vocab=DraftVocab(tuple(order), 256))


def test_drafts_come_from_the_subset_and_greedy_output_stays_plain_decoding(ranked_pair):
    pair = ranked_pair
    prompt = torch.randint(1, 250, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    plain = Generation(pair, prompt, GenerationSettings(max_new_tokens=24), baseline=True).run().tokens
    for size in (0, 1, 40, 200):
        s = GenerationSettings(max_new_tokens=24, draft_vocab=size, draft_cutoff=0.0, plain_fallback=False)
        run = Generation(pair, prompt, s).run()
        assert run.tokens == plain, f"{pair.name}: draft vocabulary {size} changed the output"
        assert run.stats.draft_vocab == (size or None) and run.stats.to_dict()["draft_ms"] > 0
        pair.prefill(prompt, s, True)
        drafts = pair.draft(plain[0], len(prompt), 8)
        if size:
            assert set(drafts) <= set(pair.vocab.ranked[:size]), "a draft outside the draft vocabulary"


def test_samples_drafted_from_a_subset_follow_the_target_exactly():
    """The proposal is the subset's renormalised distribution (zero outside it): the residual rule stays exact,
    and the tokens outside the subset still come out as often as the target says."""
    pair = random_pair("qwen3", seed=11, vocab=VOCAB, hidden=32, layers=2, heads=2, kv_heads=1, block_size=4,
                       head_scale=6.0, draft_vocab=DraftVocab((3, 1, 5, 0), VOCAB))
    assert_follows_the_target(pair, GenerationSettings(max_new_tokens=3, temperature=1.0, block_size=4,
                                                       draft_cutoff=0.0, draft_vocab=2))


def test_the_demo_pair_drafts_over_its_ranking_by_default_on_the_cpu_and_keeps_its_output():
    from engine.backends import load_pair
    pair = load_pair("torch", assets.path("demo", "target"), assets.path("demo", "draft"), device="cpu")
    assert pair.info["draft_vocab"] == len(pair.vocab.ranked)
    prompt = pair.tokenizer.encode_prompt("def parse(line):\n", raw=True)
    plain = Generation(pair, prompt, GenerationSettings(max_new_tokens=48), baseline=True).run().tokens
    default = Generation(pair, prompt, GenerationSettings(max_new_tokens=48)).run()
    assert default.tokens == plain and default.stats.draft_vocab == len(pair.vocab.ranked)   # 8k > its 3,989
    small = Generation(pair, prompt, GenerationSettings(max_new_tokens=48, draft_vocab=512)).run()
    whole = Generation(pair, prompt, GenerationSettings(max_new_tokens=48, draft_vocab=0)).run()
    assert small.tokens == whole.tokens == plain
    assert small.stats.draft_vocab == 512 and whole.stats.draft_vocab is None
    assert whole.stats.to_dict()["draft_vocab"] is None and small.stats.to_dict()["draft_ms"] > 0
    # an answer n-gram lookup drafts, or plain decoding, has no drafter's pass or vocabulary to report
    lookup = Generation(pair, prompt, GenerationSettings(max_new_tokens=48, method="ngram")).run().stats.to_dict()
    base = Generation(pair, prompt, GenerationSettings(max_new_tokens=8), baseline=True).run().stats.to_dict()
    assert (lookup["draft_ms"], lookup["draft_vocab"], base["draft_ms"], base["draft_vocab"]) == (None,) * 4



def test_mlx_drafts_over_the_subset_on_its_cpu_and_keeps_the_output():
    """The demo pair in the MLX engine (its CPU device here): a subset of its ranking, the same tokens as plain
    decoding, every draft from the subset."""
    pytest.importorskip("mlx.core", reason="the mlx engine needs mlx")
    from engine.backends import load_pair
    pair = load_pair("mlx", assets.path("demo", "target"), assets.path("demo", "draft"), device="cpu")
    prompt = pair.tokenizer.encode_prompt("def parse(line):\n", raw=True)
    plain = Generation(pair, prompt, GenerationSettings(max_new_tokens=32), baseline=True).run().tokens
    small = Generation(pair, prompt, GenerationSettings(max_new_tokens=32, draft_vocab=300, draft_cutoff=0.0,
                                                        plain_fallback=False)).run()
    assert small.tokens == plain and small.stats.draft_vocab == 300 and pair.info["draft_vocab"] > 3000
    pair.prefill(prompt, GenerationSettings(draft_vocab=300), True)
    assert set(pair.draft(plain[0], len(prompt), 16)) <= set(pair.vocab.ranked[:300])
    pair.close()


@pytest.mark.parametrize("tied", [False, True])
def test_mlx_takes_a_quantized_heads_rows_dequantized(tied):
    mx = pytest.importorskip("mlx.core", reason="the mlx engine needs mlx")
    import mlx.nn as nn

    from engine.backends.mlx.engine import head_rows
    from engine.backends.mlx.target import MlxTarget
    from tests.tiny_mlx import random_model, target_config
    config = {**target_config("qwen3", vocab=256, hidden=64, layers=2), "tie_word_embeddings": tied}
    model = random_model(config, seed=2)
    nn.quantize(model, group_size=32, bits=4)
    target = MlxTarget(model, config, mx.cpu)
    assert (target.text.get("lm_head") is None) == tied
    index = mx.array([7, 200, 3, 64])
    hidden = mx.random.normal((2, 64), key=mx.random.key(0))
    expected = target.head(hidden)[:, index]
    assert mx.allclose(hidden @ head_rows(target, index).T, expected, atol=1e-3).item()


def test_llamacpp_gives_a_plain_dflash_drafter_the_head_of_its_ranked_rows_only(tmp_path):
    from engine.backends.llamacpp.engine import drafting_vocabulary
    demo = assets.path("demo", "draft")
    ranked = draft_vocab.load(demo, 4096).ranked

    def meta(*tensors, arch="dflash"):
        return {"general.architecture": arch, "gguf.tensors": frozenset({"fc.weight", *tensors})}
    target = {"tokenizer.ggml.tokens": ["t"] * 4096}
    assert drafting_vocabulary(demo, meta(), target, None, False) == ranked          # 8k: every ranked token
    assert drafting_vocabulary(demo, meta(), target, 300, False) == ranked[:300]
    assert drafting_vocabulary(demo, meta(), target, None, True) is None             # a GPU: not measured there
    assert drafting_vocabulary(demo, meta(), target, 0, False) is None
    assert drafting_vocabulary(tmp_path, meta(), target, 300, False) is None         # no ranking beside it
    for own in (meta("output.weight"), meta("selector_hidden.weight"), meta("markov_w1.weight")):
        assert drafting_vocabulary(demo, own, target, 300, False) is None            # they score every token
    with pytest.raises(CheckpointError, match="another model"):
        drafting_vocabulary(demo, meta(), {"tokenizer.ggml.tokens": ["t"] * 5000}, 300, False)


def test_llamacpp_drafts_from_the_subset_head_and_keeps_plain_decodings_tokens(tmp_path, monkeypatch, unmeasured):
    """The demo pair on llama-server with a drafter GGUF holding 512 rows of the target's head and their ids:
    loaded by llama.cpp's own DFlash graph, greedy answers as plain decoding's (up to float-rounding ties)."""
    import numpy as np
    from gguf import GGUFReader

    from engine.backends import load_pair as torch_or_mlx
    from engine.backends.llamacpp import vocab_head
    from engine.backends.llamacpp.engine import load_pair
    from tests.test_llamacpp_engine import assert_same_up_to_rounding
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    ranked = draft_vocab.load(assets.path("demo", "draft"), 4096).ranked
    pair = load_pair(assets.path("demo", "target"), assets.path("demo", "draft"), "cpu", draft_vocab=512)
    try:
        assert pair.info["draft_vocab"] == pair.draft_vocab == 512
        tensors = {t.name: t for t in GGUFReader(str(pair.draft)).tensors}
        assert tensors["d2t"].data.tolist() == list(ranked[:512])
        rows = np.asarray(tensors["output.weight"].data, dtype=np.float32).reshape(512, -1)
        head = vocab_head.head_rows(pair.base.model, ranked[:512])
        assert rows.shape == head.shape and np.allclose(rows, head, atol=1e-3)
        with pytest.raises(CheckpointError, match="own LM head"):
            vocab_head.subset_gguf(pair.draft, head[:8], ranked[:8], tmp_path / "again.gguf")
        assert not list(tmp_path.glob("*.part"))
        reference = torch_or_mlx("torch", assets.path("demo", "target"), None, device="cpu")
        identical = 0
        for text in ("def parse(line):\n", "class Stack:\n    def __init__(self):\n"):
            ids = pair.tokenizer.encode_prompt(text, raw=True)
            want = Generation(reference, ids, GenerationSettings(max_new_tokens=48), baseline=True).run().tokens
            fast = Generation(pair, ids, GenerationSettings(max_new_tokens=48, block_size=8, method="dflash",
                                                            plain_fallback=False)).run()
            identical += assert_same_up_to_rounding(fast.tokens, want, ids, reference)
            assert fast.stats.drafted > 0 and fast.stats.accepted > 0 and fast.stats.draft_vocab == 512
        assert identical >= 1
    finally:
        pair.close()

    # a head that cannot be made (a quantization gguf-py cannot read: stood in for by raising) never fails a load
    def unreadable(target, ids):
        raise NotImplementedError("Dequantization for IQ1_M is not yet implemented")
    monkeypatch.setattr(vocab_head, "head_rows", unreadable)
    said: list[str] = []
    pair = load_pair(assets.path("demo", "target"), assets.path("demo", "draft"), "cpu", draft_vocab=256,
                     progress=lambda stage, message: said.append(message))
    try:
        assert pair.info["draft_vocab"] is None and pair.info["has_drafter"]
        assert any("drafts over every token" in m and "IQ1_M" in m for m in said), said
    finally:
        pair.close()


def test_the_head_rows_of_a_quantized_gguf_are_its_own_rows_dequantized(smollm2_gguf):
    """SmolLM2's GGUF keeps its tied head in Q8_0: the rows picked before dequantizing are the whole head's."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from engine.backends.llamacpp import vocab_head
    head = next(t for t in GGUFReader(str(smollm2_gguf)).tensors if t.name == "token_embd.weight")
    assert head.tensor_type.name == "Q8_0"
    ids = (2, 49151, 0, 300, 17)
    whole = dequantize(head.data, head.tensor_type)
    assert np.array_equal(vocab_head.head_rows(smollm2_gguf, ids), whole[list(ids)])


def test_the_cuda_paths_static_engine_drafts_from_the_subset_as_the_eager_one(monkeypatch):
    """CudaPair's code on the CPU (graphs and kernels off, as its other CPU tests): the same drafts as the eager
    engine from the same subset, and plain decoding's tokens."""
    from engine.backends.torch import cpu
    from engine.backends.torch.cuda import CudaPair
    monkeypatch.setattr(cpu, "draft_dtype", lambda: None)      # one rounding for both: drafts compared exactly
    order = torch.randperm(256, generator=torch.Generator().manual_seed(5)).tolist()
    eager = random_pair("qwen3", seed=3, head_scale=4.0, vocab=256, hidden=64, layers=4, max_positions=512,
                        draft_vocab=DraftVocab(tuple(order), 256))
    static = CudaPair(eager.target, eager.drafter, None, eager.name, "qwen3", context=300, graphs=False, bucket=64,
                      use_kernels=False, vocab=eager.vocab)
    prompt = torch.randint(1, 250, (20,), generator=torch.Generator().manual_seed(2)).tolist()
    s = GenerationSettings(max_new_tokens=24, draft_vocab=100, draft_cutoff=0.0, plain_fallback=False)
    plain = Generation(eager, prompt, GenerationSettings(max_new_tokens=24), baseline=True).run().tokens
    for pair in (eager, static):
        run = Generation(pair, prompt, s).run()
        assert run.tokens == plain and run.stats.draft_vocab == 100
    first = [p.prefill(prompt, s, True) for p in (eager, static)]
    drafts = [p.draft(first[0], len(prompt), 16) for p in (eager, static)]
    assert first[0] == first[1] and drafts[0] == drafts[1] and set(drafts[0]) <= set(order[:100])
