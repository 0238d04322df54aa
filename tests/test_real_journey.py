"""The catalog journey a new user takes, with a real chat model, through the real app: a local hub (a real HTTP
server on 127.0.0.1, tests/hub_server.py) serves a catalog pair built from SmolLM2-135M-Instruct's real files
(its Q4_1 GGUF as a llama.cpp variant, its config and tokenizer, an untrained DFlash drafter); the model picker
shows its fit on a CPU-only computer and downloads it with progress; the plan goes to the window's real worker,
the real llama-server loads it and the chat answers in English; `dflash-desktop serve` then answers the official
openai client from the downloaded folders. And a GGUF the user already has, opened from disk, with no drafter."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import openai
import pytest
from PySide6.QtWidgets import QDialogButtonBox

from dflash_desktop.catalog import bundled_path, parse_catalog
from dflash_desktop.hardware import HardwareProbe, detect
from tests.hub_server import folder_repo, hub  # noqa: F401  (fixture)
from tests.ui_fixtures import hub_window  # noqa: F401  (fixture)
from tests.test_server import start_server
from ui.pair_list_model import Roles

from engine.backends.llamacpp import build  # noqa: E402

try:
    build.find_build()
except build.BuildMissing as exc:
    pytest.skip(f"no llama.cpp build here ({exc})", allow_module_level=True)
FIXTURES = Path(__file__).parent / "fixtures" / "hardware"
LOAD_MS = 300_000
GGUF_REPO, TARGET_REPO, DRAFT_REPO = "org/SmolLM2-135M-Instruct-GGUF", "HuggingFaceTB/SmolLM2-135M-Instruct", \
    "org/SmolLM2-135M-DFlash"
QUESTION = "What is the capital of France?"


def smollm2_catalog(gguf: Path) -> dict:
    """The bundled catalog with one more pair: SmolLM2 135M with its GGUF as llama.cpp's variant."""
    data = json.loads(bundled_path().read_text())
    base = copy.deepcopy(next(p for p in data["pairs"] if p["id"] == "qwen3-4b"))
    base.update(id="smollm2-135m", name="SmolLM2 135M Instruct", notes="A real chat model; untrained drafter.",
                approximate=[], engines={"llamacpp": ["cpu"], "torch": ["cuda", "apple", "cpu"]})
    base["target"].update(repo_id=TARGET_REPO, license="apache-2.0", model_type="llama", params=134_515_008,
                          layers=30, attention_layers=30, hidden_size=576, num_attention_heads=9, num_kv_heads=3,
                          head_dim=64, vocab_size=49152, max_context=8192)
    base["drafter"].update(repo_id=DRAFT_REPO, params=5_000_000, layers=1, num_kv_heads=3, head_dim=64,
                           block_size=8, captured_layers=1, chat_mode="any", thinking=None)
    base["variants"] = {"llamacpp": [{"id": "q4_1", "label": "GGUF Q4_1 (4-bit)", "dtype": "q4_1", "target": {
        "repo_id": GGUF_REPO, "revision": "main", "files": [gguf.name], "bytes": gguf.stat().st_size}}]}
    data["pairs"] = [p for p in data["pairs"] if p["id"] == "demo"] + [base]
    data["dtype_bytes"]["q4_1"] = 0.625          # 4-bit values and two float16 per block of 32
    return data


@pytest.fixture
def window(hub_window):
    return hub_window


def ask(qtbot, window, question: str) -> dict:
    with qtbot.waitSignal(window.controller.answerFinished, timeout=LOAD_MS) as finished:
        window.controller.send(question)
    return finished.args[0]


def test_pick_download_load_chat_and_serve_a_real_model(qtbot, window, hub, smollm2_gguf, smollm2_folder,
                                                       smollm2_random_drafter, tmp_path):
    hub.repos[GGUF_REPO] = folder_repo(smollm2_gguf.parent, {smollm2_gguf.name}, "gguf")
    hub.repos[TARGET_REPO] = folder_repo(smollm2_folder, {"config.json", "generation_config.json", "tokenizer.json",
                                                   "tokenizer_config.json", "chat_template.jinja"}, "target")
    hub.repos[DRAFT_REPO] = folder_repo(smollm2_random_drafter, None, "draft")
    hub.slow_bps = 200_000_000            # about half a second for the GGUF: progress shows on the way
    cpu = detect(HardwareProbe.from_dict(json.loads((FIXTURES / "cpu_only_i5.json").read_text())))
    picker = window.open_model_picker(catalog=parse_catalog(smollm2_catalog(smollm2_gguf), "test"), hardware=cpu)
    with qtbot.waitSignal(picker.ready, timeout=30_000):
        pass
    row = next(picker.model.index(i) for i in range(picker.model.rowCount())
               if picker.model.index(i).data(Roles.Id) == "smollm2-135m")
    picker.list.setCurrentIndex(row)
    assert row.data(Roles.Verdict) == "fits", row.data(Roles.FitDetails)
    assert row.data(Roles.Plan) == {"engine": "llamacpp", "device": "cpu", "dtype": "q4_1"}
    assert "llama.cpp" in row.data(Roles.PlanLabel) and "q4_1 weights" in row.data(Roles.FitDetails)
    picker._refresh_offline()
    qtbot.waitUntil(lambda: picker.download_button.isEnabled(), timeout=30_000)
    fractions = []
    picker.model.dataChanged.connect(lambda *_: fractions.append(row.data(Roles.DownloadFraction)))
    picker.download_button.click()
    qtbot.waitUntil(lambda: row.data(Roles.DownloadState) != "downloading", timeout=120_000)
    assert row.data(Roles.DownloadState) == "ready", row.data(Roles.DownloadText)
    assert any(0 < (f or 0) < 1 for f in fractions), fractions

    with qtbot.waitSignal(window.session.pairLoaded, timeout=LOAD_MS) as loaded:
        picker.load_button.click()
    info = loaded.args[0]
    assert (info.engine, info.dtype, info.event["architecture"], info.has_drafter) == \
        ("llamacpp", "q4_1", "llama", True), info
    # what the calibration measured fastest is remembered, and the model list shows it when opened again
    measured = window.settings.measured[window.session.pair.measured_key]
    assert measured["method"] == info.method and info.speculation["reason"] in measured["summary"]
    again = window.open_model_picker(catalog=parse_catalog(smollm2_catalog(smollm2_gguf), "test"), hardware=cpu)
    with qtbot.waitSignal(again.ready, timeout=30_000):
        pass
    again.list.setCurrentIndex(next(again.model.index(i) for i in range(again.model.rowCount())
                                    if again.model.index(i).data(Roles.Id) == "smollm2-135m"))
    assert again.measured_label.text() == f"Measured fastest here when last loaded: {measured['summary']}"
    again.reject()
    answer = ask(qtbot, window, QUESTION)
    assert answer["event"] == "done" and len(answer["text"].split()) >= 3, answer
    stored = window.controller.store.messages(window.controller.conversation_id)
    assert stored[-1].content == answer["text"] and stored[-2].content == QUESTION

    target, draft = Path(info.target), Path(info.event["draft"])
    # the user's own `serve` on the app folder the window uses: the calibration above is remembered, not run again
    proc, url = start_server(tmp_path / "home", "--engine", "llamacpp", "--target", str(target),
                             "--draft", str(draft), "--model-name", "smollm2-135m")
    try:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
        assert [m.id for m in client.models.list().data] == ["smollm2-135m"]
        chat = client.chat.completions.create(model="smollm2-135m", temperature=0, max_tokens=32,
                                              messages=[{"role": "user", "content": QUESTION}])
        assert len(chat.choices[0].message.content.split()) >= 3 and chat.usage.completion_tokens > 0
    finally:
        proc.terminate()
        proc.wait(30)
    from engine.backends.llamacpp.calibrate import STORE
    measured = json.loads((tmp_path / "home" / "cache" / STORE).read_text())
    assert len(measured) == 1, f"serve ran another drafter or measured again: {list(measured)}"


def test_a_gguf_the_user_has_opens_from_disk_and_chats_without_a_drafter(qtbot, window, smollm2_gguf):
    dialog = window.open_model_picker().open_local()
    dialog.target.setText(str(smollm2_gguf))
    with qtbot.waitSignal(window.session.pairLoaded, timeout=LOAD_MS) as loaded:
        dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    info = loaded.args[0]
    assert (info.engine, info.dtype, info.has_drafter) == ("llamacpp", "q4_1", False), info
    answer = ask(qtbot, window, "Name the largest planet in the solar system.")
    assert answer["event"] == "done" and len(answer["text"].split()) >= 3, answer
    panel = window.controller.panel
    if info.method == "none":        # the calibration measured plain decoding fastest on this machine
        assert "no drafter" in panel.acceptance_label.text()
        assert "Plain decoding: no drafter" in panel.runtime.text()
    else:                            # a method that needs no drafter won here (n-gram lookup on some CPUs)
        assert info.method == "ngram", info.event
        assert "n-gram lookup" in panel.runtime.text() and "no drafter" not in panel.acceptance_label.text()
