"""The first-run welcome and the About box, through the real window (no model loaded, no worker started):
shown once per profile, reopened from Help, the real hardware probe's answer in it, "Choose a model…"
opening the model picker; About names the versions (read from package metadata: tests/test_gui_imports.py
checks that no window module imports an engine library)."""
from __future__ import annotations

import platform
from importlib.metadata import version

import pytest
from PySide6.QtWidgets import QApplication

from dflash_desktop import settings as settings_mod
from dflash_desktop.chat_store import ChatStore
from dflash_desktop.hardware import detect_live
from dflash_desktop.qt_worker import QtWorker
from ui.app import greet
from ui.welcome import WelcomeDialog


@pytest.fixture
def make(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    from ui.main_window import MainWindow
    workers = []

    def window():
        workers.append(QtWorker())
        w = MainWindow(worker=workers[-1], store=ChatStore(), settings=settings_mod.load(), autoload=False)
        qtbot.addWidget(w)
        w.show()
        return w
    yield window
    for worker in workers:
        worker.shutdown(5)


def welcomes(window) -> list[WelcomeDialog]:
    return [d for d in window.findChildren(WelcomeDialog) if d.isVisible()]


def test_a_new_profile_is_welcomed_once(qtbot, make):
    first = make()
    assert not first.settings.welcome_seen
    greet(first)
    qtbot.waitUntil(lambda: bool(welcomes(first)), timeout=5000)
    dialog = welcomes(first)[0]
    from ui.welcome import chat_installed      # it speaks of the pair the first start opens
    assert ("SmolLM2-135M-Instruct" if chat_installed() else "Python") in dialog.text()
    assert "Models…" in dialog.text() and "Open from disk" in dialog.text()
    for label in dialog.paragraphs:        # every paragraph whole: its height fits its wrapped text
        assert label.height() >= label.heightForWidth(label.width()), label.text()[:40]
    assert settings_mod.load().welcome_seen            # saved, so the next start does not ask again
    dialog.start_button.click()
    assert not welcomes(first)

    second = make()                                    # the same profile, started again
    greet(second)
    qtbot.wait(200)
    assert not welcomes(second)


def test_the_welcome_shows_the_hardware_the_probe_found(qtbot, make):
    window = make()
    dialog = window.show_welcome()
    report = detect_live()
    qtbot.waitUntil(lambda: "checking" not in dialog.hardware.text(), timeout=30_000)
    # the probe's sentence (its free-memory figure moves between two probes, so up to it) and the CPU
    assert report.reason.split(" (")[0][1:] in dialog.hardware.text() and report.cpu.model in dialog.hardware.text()


def test_help_reopens_the_welcome_and_its_button_opens_the_model_picker(qtbot, make):
    from ui.model_picker import ModelPicker
    window = make()
    window.settings.welcome_seen = True
    assert window.welcome_action in window.menus["Help"].actions()
    window.welcome_action.trigger()
    qtbot.waitUntil(lambda: bool(welcomes(window)), timeout=5000)
    welcomes(window)[0].models_button.click()
    qtbot.waitUntil(lambda: any(p.isVisible() for p in window.findChildren(ModelPicker)), timeout=5000)
    assert not welcomes(window)


def test_about_names_the_app_runtime_and_engine_versions(qtbot, make):
    window = make()
    box = window.show_about()
    text = box.text()
    assert f"DFlash Desktop {version('dflash-desktop')}" in text
    assert f"Python {platform.python_version()}" in text and "Qt " in text and "Apache License 2.0" in text
    assert f"torch {version('torch')}" in text and "no model loaded" in text
    box.close()
    QApplication.processEvents()


def test_the_hardware_line_names_a_gpu_found_through_vulkan():
    import json
    from pathlib import Path

    from dflash_desktop.hardware import HardwareProbe, detect
    from ui.welcome import hardware_text
    fixture = Path(__file__).parent / "fixtures" / "hardware" / "amd_rx7800xt_vulkan.json"
    text = hardware_text(detect(HardwareProbe.from_dict(json.loads(fixture.read_text()))))
    assert "Using the AMD Radeon RX 7800 XT (RADV NAVI32) through Vulkan (llama.cpp)" in text
    assert "<br>Vulkan1: AMD Radeon RX 7800 XT (RADV NAVI32), 17.2 GB (Vulkan)" in text
    assert "Vulkan0: Intel(R) UHD Graphics 630" in text
