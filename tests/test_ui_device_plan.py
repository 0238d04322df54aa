"""What the model picker decides (engine, device, dtype) is what a real worker is asked to load, decided
from recorded NVIDIA, Apple and CPU machines. This machine has no GPU, so its CPU stands in: the worker
refuses the GPU with a message that names it, the chat offers the CPU, and the CPU load is what the
status bar and the stats panel then report."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_desktop.catalog import load_catalog
from dflash_desktop.hardware import HardwareProbe, detect
from dflash_desktop.run_plan import plan_for
from tests.ui_chat_fixtures import LOAD_TIMEOUT_MS, chat_worker, echo_pair, home, make_window  # noqa: F401
from ui.errors import ErrorBubble

FIXTURES = Path(__file__).parent / "fixtures" / "hardware"


def report_of(fixture: str):
    return detect(HardwareProbe.from_dict(json.loads((FIXTURES / f"{fixture}.json").read_text())))


@pytest.fixture
def sent(chat_worker, monkeypatch):
    """Every load_pair request's plan as it leaves for the worker (recorded, then passed on unchanged; whether the
    worker may compare engines is tests/test_fastest.py's)."""
    calls = []
    original = chat_worker.load_pair

    def record(*args, **kwargs):
        calls.append({k: v for k, v in kwargs.items() if k not in ("on_event", "compare")})
        return original(*args, **kwargs)
    monkeypatch.setattr(chat_worker, "load_pair", record)
    return calls


@pytest.mark.parametrize("fixture, device, refusal", [
    ("nvidia_rtx4090_nvml", "cuda", "The NVIDIA GPU (cuda) cannot be used"),
    ("apple_m2_16gb", "mps", "Apple's GPU (mps) cannot be used"),
    ("cpu_only_i5", "cpu", None),
])
def test_the_pickers_plan_reaches_a_real_worker(qtbot, home, chat_worker, echo_pair, sent, fixture, device, refusal):
    report = report_of(fixture)
    # the torch engine's device path (llama.cpp and mlx, first on a CPU and a Mac: their own tests)
    report.engines_missing = {"llamacpp": "not built", "mlx": "not installed"}
    plan = plan_for(load_catalog(prefer_refreshed=False).demo, report)
    assert plan.device == device
    window = make_window(qtbot, chat_worker, {**echo_pair, "plan": plan.request}, wait_ready=refusal is None)
    assert sent[0] == plan.request
    if refusal:
        qtbot.waitUntil(lambda: window.load_error_box is not None, timeout=LOAD_TIMEOUT_MS)
        box = window.load_error_box      # a dialog, not a card in whichever chat is open
        assert box.isVisible() and not any(isinstance(w, ErrorBubble) for w in window.chat_view.messages)
        assert refusal in box.informativeText() and box.error["code"] == "device_unavailable"
        assert box.text() == "Could not load Echo test pair." and "No model is loaded now" in box.informativeText()
        assert box.action_button.text() == "Load on the CPU"
        box.action_button.click()
        qtbot.waitUntil(lambda: window.session.ready, timeout=LOAD_TIMEOUT_MS)
        assert sent[1] == {"engine": "torch", "device": "cpu", "dtype": None}
    loaded = window.session.loaded
    assert (loaded.engine, loaded.device, loaded.dtype) == ("torch", "cpu", "float32")
    assert window.stats_panel.runtime.text() == "Runs on cpu · torch engine · float32 weights"
    assert "torch on cpu, float32" in window.pair_label.text()


THINKING_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                     "{% if enable_thinking is defined and not enable_thinking %}(no thinking)\n{% endif %}assistant:")


@pytest.mark.parametrize("trained", [True, False])
def test_the_thinking_switch_follows_the_drafters_training_and_an_override_is_explained(
        qtbot, home, chat_worker, tmp_path, trained):
    from tests.tiny_torch import save_random_pair
    target, draft = save_random_pair(tmp_path / "pair", block_size=8, chat_template=THINKING_TEMPLATE)
    pair = {"id": "thinker", "name": "Thinking test pair", "target_dir": str(target), "draft_dir": str(draft),
            "thinking": trained}
    window = make_window(qtbot, chat_worker, pair)
    box = window.chat_view.thinking
    assert box.isVisible() and box.isChecked() == trained, "the switch starts as the drafter was trained"
    box.setChecked(not trained)
    assert f"trained with thinking {'on' if trained else 'off'}" in window.status_label.text()


def test_a_drafter_the_planned_engine_refuses_offers_the_engine_that_runs_it(qtbot, home, chat_worker, tmp_path, sent):
    """A plan sends PyTorch an EAGLE-3 drafter in a layout only llama.cpp converts (speculators' Eagle3Speculator):
    the real worker refuses it by name and names llama.cpp, the dialog offers "Load with llama.cpp", and the click
    loads the pair there (a real llama-server)."""
    from engine.bench import DEMO_DIR
    from tests.tiny_torch import random_eagle3
    target = DEMO_DIR / "target"
    draft = random_eagle3(tmp_path / "eagle3", json.loads((target / "config.json").read_text()), [1, 3, 5])
    raw = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**raw, "architectures": ["Eagle3Speculator"]}))
    pair = {"id": "spec", "name": "Demo with a speculators EAGLE-3", "target_dir": str(target),
            "draft_dir": str(draft), "plan": {"engine": "torch", "device": "cpu", "dtype": None}}
    window = make_window(qtbot, chat_worker, pair, wait_ready=False)
    qtbot.waitUntil(lambda: window.load_error_box is not None, timeout=LOAD_TIMEOUT_MS)
    box = window.load_error_box
    assert box.error["code"] == "unsupported_architecture" and box.error["alternatives"] == ["llamacpp"]
    assert "Eagle3Speculator" in box.informativeText() and "llama.cpp engine" in box.informativeText()
    assert box.action_button.text() == "Load with llama.cpp"
    box.action_button.click()
    qtbot.waitUntil(lambda: window.session.ready, timeout=3 * LOAD_TIMEOUT_MS)   # converts, starts, calibrates
    assert sent[-1] == {"engine": "llamacpp", "device": "auto", "dtype": None}
    loaded = window.session.loaded
    assert loaded.engine == "llamacpp" and loaded.has_drafter and "eagle3" in loaded.event["methods"]
