"""DFlash drafters saved by vLLM's speculators library (engine/speculators.py): the demo pair's drafter written in
that format, with a draft vocabulary of its own (d2t) and copies of the target's embedding and head, imports once
into z-lab's format and then drafts in torch, MLX and llama.cpp exactly as the z-lab drafter restricted to the same
tokens does, keeping plain decoding's output; every way such a folder can be wrong is refused by name."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import assets
from engine import draft_vocab, speculators
from engine.backends import load_pair
from engine.config import DraftConfig
from engine.errors import CheckpointError
from engine.limits import GenerationSettings
from engine.loop import Generation

TARGET, DRAFT = assets.path("demo", "target"), assets.path("demo", "draft")
KEPT = 1024        # tokens the speculators drafter "was trained on": the demo ranking's first, in id order
PROMPTS = ("def parse(line):\n", "class Stack:\n    def __init__(self):\n")


def subset() -> list[int]:
    return sorted(draft_vocab.load(DRAFT, 4096).ranked[:KEPT])


def speculators_config(**changes) -> dict:
    zlab = json.loads((DRAFT / "config.json").read_text(encoding="utf-8"))
    layer = {k: v for k, v in zlab.items() if k not in ("architectures", "dflash_config", "block_size",
                                                        "num_target_layers", "torch_dtype")}
    raw = {"speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"],
           "transformer_layer_config": {**layer, "architectures": ["Qwen3ForCausalLM"],
                                        "_attn_implementation": "sdpa"},
           "draft_vocab_size": KEPT, "block_size": 16, "target_hidden_size": None, "mask_token_id": 1,
           "aux_hidden_state_layer_ids": [i + 1 for i in zlab["dflash_config"]["target_layer_ids"]],
           "sliding_window_non_causal": False, "sample_from_anchor": False,
           "speculators_config": {"algorithm": "dflash", "proposal_methods": [], "verifier": {}}}
    raw.update(changes)
    return raw


def write_speculators(folder, config: dict | None = None, d2t: torch.Tensor | None = None):
    """The demo drafter as speculators saves one: its layers, the target's embedding and head rows of the kept
    tokens, d2t (target id - draft id) and t2d, in two shards."""
    layers = load_file(DRAFT / "model.safetensors")
    embed = load_file(TARGET / "model.safetensors")["model.embed_tokens.weight"]     # the demo target is tied
    ids = torch.tensor(subset())
    t2d = torch.zeros(embed.shape[0], dtype=torch.bool)
    t2d[ids] = True
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(layers)
    save_file({n: layers[n] for n in names[:7]}, folder / "model-00001-of-00002.safetensors")
    save_file({**{n: layers[n] for n in names[7:]}, "embed_tokens.weight": embed, "lm_head.weight": embed[ids],
               "d2t": ids - torch.arange(KEPT) if d2t is None else d2t, "t2d": t2d},
              folder / "model-00002-of-00002.safetensors")
    (folder / "config.json").write_text(json.dumps(config or speculators_config()), encoding="utf-8")
    return folder


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def folders(tmp_path, home):
    """The speculators drafter, and the z-lab drafter with the same tokens as a trained draft vocabulary."""
    spec = write_speculators(tmp_path / "Demo-speculator.dflash")
    zlab = tmp_path / "zlab"
    zlab.mkdir()
    for name in ("config.json", "model.safetensors"):
        (zlab / name).write_bytes((DRAFT / name).read_bytes())
    draft_vocab.DraftVocab(tuple(subset()), 4096, "test", trained=True).save(zlab, 0)
    return spec, zlab


def test_the_import_is_the_z_lab_drafter_with_its_trained_tokens_made_once(folders, home):
    spec, _ = folders
    said = []
    out = speculators.imported(spec, lambda stage, message: said.append(message))
    assert out.parent == home / "cache" / "drafters" and said and "speculators" in said[0]
    want, got = DraftConfig.from_file(DRAFT / "config.json"), DraftConfig.from_file(out / "config.json")
    same = ("hidden_size", "num_hidden_layers", "head_dim", "vocab_size", "block_size", "mask_token_id",
            "target_layer_ids", "causal", "layer_types", "rms_norm_eps", "max_position_embeddings")
    assert [getattr(got, k) for k in same] == [getattr(want, k) for k in same]
    assert DraftConfig.from_file(spec / "config.json").target_layer_ids == want.target_layer_ids   # read in place
    kept = {k: v for k, v in load_file(out / "model.safetensors").items()}
    zlab = load_file(DRAFT / "model.safetensors")
    assert set(kept) == set(zlab) and all(torch.equal(kept[k], zlab[k]) for k in zlab)
    vocab = draft_vocab.load(out, 4096)
    assert vocab.trained and list(vocab.ranked) == subset() and "d2t" in vocab.corpus
    assert vocab.chosen(None, True) == vocab.chosen(None, False) == tuple(subset())    # all of it, on every device
    assert vocab.chosen(0, True) is None and vocab.chosen(10, True) == tuple(subset()[:10])
    stamp = os.stat(out / "model.safetensors").st_mtime_ns
    assert speculators.imported(spec) == out and os.stat(out / "model.safetensors").st_mtime_ns == stamp
    assert speculators.imported(DRAFT) == DRAFT                     # a z-lab folder is read as it is
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]   # no half-written folder left


def test_a_changed_drafter_is_imported_again(folders):
    spec, _ = folders
    first = speculators.imported(spec)
    write_speculators(spec, speculators_config(aux_hidden_state_layer_ids=[1, 2, 3]))
    second = speculators.imported(spec)
    assert second != first and DraftConfig.from_file(second / "config.json").target_layer_ids == (0, 1, 2)


def test_sliding_layers_that_see_the_whole_block_are_said_so():
    layer = {**speculators_config()["transformer_layer_config"], "sliding_window": 64,
             "layer_types": ["sliding_attention", "full_attention"]}
    causal = DraftConfig.from_dict(speculators_config(transformer_layer_config=layer)).causal
    open_ = DraftConfig.from_dict(speculators_config(transformer_layer_config=layer,
                                                     sliding_window_non_causal=True)).causal
    assert causal == (True, False) and open_ == (False, False)


def test_qwen3_defaults_fill_what_the_saved_config_leaves_out():
    """speculators saves its layer settings as a difference from transformers' Qwen3Config; what it leaves out is
    that class's default, as its own loader reads it."""
    layer = {k: v for k, v in speculators_config()["transformer_layer_config"].items()
             if k not in ("vocab_size", "rms_norm_eps", "hidden_act")}
    cfg = DraftConfig.from_dict(speculators_config(transformer_layer_config=layer))
    assert (cfg.vocab_size, cfg.rms_norm_eps) == (151936, 1e-6)


@pytest.mark.parametrize("changes, words", [
    ({"speculators_model_type": "dflash2"}, "DFlash2 format"),
    ({"sample_from_anchor": True}, "anchor slot"),
    ({"transformer_layer_config": None}, "no transformer_layer_config"),
    ({"mask_token_id": None}, "without mask_token_id"),
    ({"aux_hidden_state_layer_ids": [0, 2, 3]}, "counted from 1"),
    ({"target_hidden_size": 512}, "target_hidden_size 512"),
])
def test_a_speculators_drafter_engines_cannot_run_is_refused_by_name(changes, words, tmp_path, home):
    raw = speculators_config(**changes)
    with pytest.raises(CheckpointError) as err:
        DraftConfig.from_dict(raw, "the drafter")
    assert words in str(err.value) and ("Pick" in str(err.value) or "re-download" in str(err.value).lower())
    with pytest.raises(CheckpointError, match=words):      # the import stops there too, leaving nothing
        speculators.imported(write_speculators(tmp_path / "bad", raw))
    assert not (home / "cache" / "drafters").exists() or not list((home / "cache" / "drafters").iterdir())


@pytest.mark.parametrize("d2t, words", [
    (torch.full((KEPT,), 5000, dtype=torch.int64), "outside the target's vocabulary"),
    (torch.zeros(KEPT, dtype=torch.int64) - torch.arange(KEPT), "twice"),      # every draft id onto token 0
    (torch.zeros((2, 2), dtype=torch.int64), "list of integers"),
])
def test_a_damaged_d2t_is_refused_by_name(d2t, words, tmp_path, home):
    with pytest.raises(CheckpointError, match=words):
        speculators.imported(write_speculators(tmp_path / "bad", d2t=d2t))


def test_an_embedding_that_disagrees_with_the_config_is_refused(tmp_path, home):
    layer = {**speculators_config()["transformer_layer_config"], "vocab_size": 8192}
    folder = write_speculators(tmp_path / "bad", speculators_config(transformer_layer_config=layer),
                               d2t=torch.tensor(subset()) - torch.arange(KEPT))
    with pytest.raises(CheckpointError, match="the files disagree"):
        speculators.imported(folder)


def run(pair, settings: GenerationSettings):
    out = []
    for text in PROMPTS:
        ids = pair.tokenizer.encode_prompt(text, raw=True)
        out.append(Generation(pair, ids, settings).run())
    return out


@pytest.mark.parametrize("engine", ["torch", "mlx"])
def test_it_drafts_as_the_z_lab_drafter_on_its_tokens_and_keeps_plain_decodings_output(folders, engine):
    """torch and MLX (its CPU device here): the same tokens as plain decoding, and the same drafts, step for step,
    as the z-lab drafter given the same tokens; the answer drafts from all its trained tokens by default."""
    if engine == "mlx":
        pytest.importorskip("mlx.core", reason="the mlx engine needs mlx")
    spec, zlab = folders
    settings = GenerationSettings(max_new_tokens=48, plain_fallback=False, draft_cutoff=0.0)
    imported = load_pair(engine, TARGET, spec, device="cpu")
    reference = load_pair(engine, TARGET, zlab, device="cpu")
    try:
        plain = [Generation(imported, imported.tokenizer.encode_prompt(t, raw=True),
                            GenerationSettings(max_new_tokens=48), baseline=True).run().tokens for t in PROMPTS]
        got, want = run(imported, settings), run(reference, settings)
        assert [g.tokens for g in got] == plain == [w.tokens for w in want]
        assert [(g.stats.drafted, g.stats.accepted) for g in got] == [(w.stats.drafted, w.stats.accepted)
                                                                      for w in want]
        assert sum(g.stats.accepted for g in got) > 0 and {g.stats.draft_vocab for g in got} == {KEPT}
    finally:
        for pair in (imported, reference):
            getattr(pair, "close", lambda: None)()


def test_llamacpp_converts_the_import_and_keeps_plain_decodings_tokens(folders):
    from engine.backends.llamacpp import build
    try:
        build.find_build()
    except build.BuildMissing as exc:
        pytest.skip(f"no llama.cpp build here ({exc})")
    from gguf import GGUFReader

    from tests.test_llamacpp_engine import assert_same_up_to_rounding
    spec, _ = folders
    reference = load_pair("torch", TARGET, None, device="cpu")
    pair = load_pair("llamacpp", TARGET, spec, device="cpu")
    try:
        assert pair.info["has_drafter"] and pair.draft_vocab == KEPT
        tensors = {t.name: t for t in GGUFReader(str(pair.draft)).tensors}
        assert tensors["d2t"].data.tolist() == subset()
        identical = 0
        for text in PROMPTS:
            ids = pair.tokenizer.encode_prompt(text, raw=True)
            want = Generation(reference, ids, GenerationSettings(max_new_tokens=48), baseline=True).run().tokens
            fast = Generation(pair, ids, GenerationSettings(max_new_tokens=48, block_size=8,
                                                            plain_fallback=False)).run()
            identical += assert_same_up_to_rounding(fast.tokens, want, ids, reference)
            assert fast.stats.drafted > 0 and fast.stats.accepted > 0
        assert identical >= 1
    finally:
        pair.close()
