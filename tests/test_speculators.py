"""DFlash drafters saved by vLLM's speculators library (engine/speculators.py): the demo pair's drafter written in
that format, with a draft vocabulary of its own (d2t) and copies of the target's embedding and head, imports once
into z-lab's format and then drafts in torch, MLX and llama.cpp exactly as the z-lab drafter restricted to the same
tokens does, keeping plain decoding's output; every way such a folder can be wrong is refused by name."""
from __future__ import annotations

import json
import os
from pathlib import Path

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
from tests.hub_server import hub  # noqa: F401  (fixture)
from tests.ui_fixtures import hub_window  # noqa: F401  (fixture)

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


def test_a_changed_drafter_is_imported_again_and_its_old_import_removed(folders, tmp_path):
    spec, _ = folders
    first = speculators.imported(spec)
    twin = write_speculators(tmp_path / "elsewhere" / spec.name)      # another folder of the same name
    other = speculators.imported(twin)
    write_speculators(spec, speculators_config(aux_hidden_state_layer_ids=[1, 2, 3]))
    second = speculators.imported(spec)
    assert second != first and DraftConfig.from_file(second / "config.json").target_layer_ids == (0, 1, 2)
    assert not first.exists() and (other / "config.json").is_file()     # the twin's import is not this one's


def test_two_loads_importing_at_once_both_get_the_complete_import(folders):
    import threading
    spec, _ = folders
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(speculators.imported(spec))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2 and got[0] == got[1] and (got[0] / "config.json").is_file()
    assert set(load_file(got[0] / "model.safetensors")) == set(load_file(DRAFT / "model.safetensors"))
    assert [p.name for p in got[0].parent.iterdir()] == [got[0].name]      # nothing half-written left


def test_sliding_layers_that_see_the_whole_block_are_said_so():
    layer = {**speculators_config()["transformer_layer_config"], "sliding_window": 64, "use_sliding_window": True,
             "layer_types": ["sliding_attention", "full_attention"]}
    causal = DraftConfig.from_dict(speculators_config(transformer_layer_config=layer)).causal
    open_ = DraftConfig.from_dict(speculators_config(transformer_layer_config=layer,
                                                     sliding_window_non_causal=True)).causal
    assert causal == (True, False) and open_ == (False, False)


def test_qwen3_defaults_fill_what_the_saved_config_leaves_out():
    """speculators saves its layer settings as a difference from transformers' Qwen3Config; what it leaves out is
    that class's default, as its own loader reads it: a width of 4096, checked against target_hidden_size once
    filled; and without use_sliding_window, "sliding" layers that see every position."""
    layer = {k: v for k, v in speculators_config()["transformer_layer_config"].items()
             if k not in ("vocab_size", "rms_norm_eps", "hidden_act", "hidden_size")}
    cfg = DraftConfig.from_dict(speculators_config(transformer_layer_config=layer, target_hidden_size=4096))
    assert (cfg.vocab_size, cfg.rms_norm_eps, cfg.hidden_size) == (151936, 1e-6, 4096)
    sliding = {**layer, "sliding_window": 64, "layer_types": ["sliding_attention", "sliding_attention"]}
    off = DraftConfig.from_dict(speculators_config(transformer_layer_config=sliding))
    on = DraftConfig.from_dict(speculators_config(transformer_layer_config={**sliding, "use_sliding_window": True}))
    assert (off.layer_types, off.sliding_window, off.causal) == (("full_attention",) * 2, None, (False, False))
    assert (on.layer_types, on.sliding_window, on.causal) == (("sliding_attention",) * 2, 64, (True, True))


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
    (torch.zeros((2, 2), dtype=torch.int64), "list of at most 4096 integers"),
    (torch.zeros(5000, dtype=torch.int64), "list of at most 4096 integers"),      # longer than the vocabulary
])
def test_a_damaged_d2t_is_refused_by_name(d2t, words, tmp_path, home):
    with pytest.raises(CheckpointError, match=words):
        speculators.imported(write_speculators(tmp_path / "bad", d2t=d2t))


def test_a_layer_whose_bytes_disagree_with_its_shape_is_refused_and_nothing_is_kept(tmp_path, home):
    """A header that claims a larger shape than its bytes hold: refused by name, no import left behind."""
    folder = write_speculators(tmp_path / "bad")
    shard = folder / "model-00001-of-00002.safetensors"
    data = shard.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    name = next(n for n in header if n != "__metadata__")
    header[name]["shape"] = [header[name]["shape"][0] * 2, *header[name]["shape"][1:]]
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    shard.write_bytes(len(blob).to_bytes(8, "little") + blob + data[8 + length:])
    with pytest.raises(CheckpointError, match=f"{name}'s bytes do not match its shape"):
        speculators.imported(folder)
    assert not [p for p in (home / "cache" / "drafters").iterdir()]


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


@pytest.mark.parametrize("open_block", [False, True])
def test_mlx_and_torch_draft_alike_whichever_layers_see_the_whole_block(tmp_path, home, open_block):
    """A drafter with a sliding layer (window 8) beside a full one, its sliding layers causal in the block or
    not (sliding_window_non_causal): MLX's drafts equal torch's, and the setting changes them."""
    pytest.importorskip("mlx.core", reason="the mlx engine needs mlx")
    layer = {**speculators_config()["transformer_layer_config"], "sliding_window": 8, "use_sliding_window": True,
             "layer_types": ["sliding_attention", "full_attention"]}
    drafts = {}
    for non_causal in (False, True):
        folder = write_speculators(tmp_path / f"spec-{non_causal}", speculators_config(
            transformer_layer_config=layer, sliding_window_non_causal=non_causal))
        for engine in ("torch", "mlx"):
            pair = load_pair(engine, TARGET, folder, device="cpu")
            prompt = pair.tokenizer.encode_prompt(PROMPTS[1], raw=True)
            settings = GenerationSettings(draft_cutoff=0.0)
            first = pair.prefill(prompt, settings, True)
            drafts[engine, non_causal] = pair.draft(first, len(prompt), 16)
            getattr(pair, "close", lambda: None)()
    assert drafts["torch", open_block] == drafts["mlx", open_block]
    assert drafts["torch", False] != drafts["torch", True]


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


def test_llamacpp_converts_the_import_and_keeps_plain_decodings_tokens(folders, unmeasured):
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
            fast = Generation(pair, ids, GenerationSettings(max_new_tokens=48, block_size=8, method="dflash",
                                                            plain_fallback=False)).run()
            identical += assert_same_up_to_rounding(fast.tokens, want, ids, reference)
            assert fast.stats.drafted > 0 and fast.stats.accepted > 0 and fast.stats.draft_vocab == KEPT
        assert identical >= 1
    finally:
        pair.close()


def test_the_catalog_journey_downloads_imports_and_chats_with_a_second_dflash_drafter(qtbot, tmp_path, hub,
                                                                                      hub_window):
    """Through the real window: a catalog pair whose target has z-lab's DFlash drafter and a speculators one (served
    by a local hub, tests/hub_server.py); the model list offers both, the user picks the speculators one, it
    downloads alone, the real worker imports and loads it, and the answer drafts from its trained tokens."""
    import copy

    from dflash_desktop.catalog import bundled_path, parse_catalog
    from dflash_desktop.hardware import HardwareProbe, detect
    from tests.hub_server import folder_repo
    from ui.pair_list_model import Roles

    hub.repos["org/code-target"] = folder_repo(TARGET, seed="target")
    hub.repos["z-lab/code-draft"] = folder_repo(DRAFT, seed="zlab")
    hub.repos["RedHatAI/code-speculator.dflash"] = folder_repo(write_speculators(tmp_path / "spec"), seed="spec")
    data = json.loads(bundled_path().read_text())
    pair = copy.deepcopy(next(p for p in data["pairs"] if p["id"] == "qwen3-4b"))
    pair.update(id="code-hub", name="Code pair (hub)", approximate=[], variants={}, engines={"torch": ["cpu"]})
    pair["target"].update(repo_id="org/code-target", params=2_900_000, layers=6, attention_layers=6,
                          hidden_size=256, num_attention_heads=4, num_kv_heads=2, head_dim=64, vocab_size=4096,
                          max_context=2048)
    shape = dict(layers=2, num_kv_heads=2, head_dim=64, block_size=16, captured_layers=3, chat_mode="any",
                 thinking=None)
    pair["drafter"].update(repo_id="z-lab/code-draft", params=2_000_000, **shape)
    pair["drafters"] = [{**pair["drafter"], "method": "dflash", "repo_id": "RedHatAI/code-speculator.dflash",
                         "params": 4_000_000, "loaded_params": 2_000_000}]
    data["pairs"] = [pair]
    catalog = parse_catalog(data, "test")

    window = hub_window
    fixture = Path(__file__).parent / "fixtures" / "hardware" / "cpu_only_i5.json"
    cpu = detect(HardwareProbe.from_dict(json.loads(fixture.read_text())))
    picker = window.open_model_picker(catalog=catalog, hardware=cpu)
    with qtbot.waitSignal(picker.ready, timeout=30_000):
        pass
    picker.list.setCurrentIndex(picker.model.index(0))
    labels = [picker.method_box.itemText(i) for i in range(picker.method_box.count())]
    assert labels[0].startswith("DFlash drafter (z-lab)") and labels[1].startswith("DFlash drafter (RedHatAI)")
    picker.method_box.activated.emit(1)
    row = picker.model.index(0)
    picker.list.setCurrentIndex(row)
    picker._refresh_offline()
    qtbot.waitUntil(lambda: picker.download_button.isEnabled(), timeout=30_000)
    picker.download_button.click()
    qtbot.waitUntil(lambda: row.data(Roles.DownloadState) != "downloading", timeout=120_000)
    assert row.data(Roles.DownloadState) == "ready", row.data(Roles.DownloadText)
    assert not [r for r in hub.requests if "z-lab/code-draft" in r["path"]]     # only the chosen drafter
    with qtbot.waitSignal(window.session.pairLoaded, timeout=300_000) as loaded:
        picker.load_button.click()
    info = loaded.args[0]
    assert (info.engine, info.has_drafter) == ("torch", True), info
    with qtbot.waitSignal(window.controller.answerFinished, timeout=300_000) as finished:
        window.controller.send("def parse(line):\n")
    answer = finished.args[0]
    assert answer["event"] == "done" and answer["text"].strip(), answer
    stats = window.controller.store.messages(window.controller.conversation_id)[-1].stats
    assert stats["draft_vocab"] == KEPT and stats["drafted"] > 0, stats
