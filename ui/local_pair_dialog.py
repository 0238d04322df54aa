"""Open a pair from disk: a target (a GGUF file, or a model folder) and, optionally, its drafter (a DFlash GGUF,
or a drafter folder in the z-lab or speculators format, or another kind llama.cpp runs). Only that the paths exist is checked here; what
they hold is checked by the engine when it loads them, and a mismatch is reported in the chat like any
failed load."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (QDialog, QFileDialog, QFormLayout, QHBoxLayout, QLabel,
                               QLineEdit, QPushButton, QVBoxLayout, QWidget)

from dflash_desktop.pairs import PairRequest
from dflash_desktop.run_plan import AUTO

from .dialog_parts import ok_cancel, warning_label


def engine_for(target: Path) -> str:
    """A GGUF target can only run in llama.cpp; a safetensors folder goes to the worker's own choice."""
    if target.suffix.lower() == ".gguf" or (target.is_dir() and any(target.glob("*.gguf"))):
        return "llamacpp"
    return AUTO["engine"]


class LocalPairDialog(QDialog):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Open a model from disk")
        intro = QLabel("A target model and, optionally, its drafter. A target can be a GGUF file (run by "
                       "llama.cpp) or a folder with config.json and safetensors; a drafter a DFlash, DFlash2 or DSpark "
                       "GGUF or folder (z-lab's, DeepSpec's, or vLLM speculators', imported once), an EAGLE-3 "
                       "drafter (SpecForge's run in every engine, others in llama.cpp) or a Gemma 4 assistant "
                       "(llama.cpp only), converted for llama.cpp when needed. Without one, the model still speculates "
                       "with n-gram lookup where that measures faster. Nothing in the folders is ever run as code.")
        intro.setWordWrap(True)
        self.target = self._path_field("Target model file or folder", "for example ~/models/Qwen3-4B-Q4_K_M.gguf")
        self.draft = self._path_field("Drafter file or folder", "optional: without one, n-gram lookup or plain decoding")
        form = QFormLayout()
        form.addRow("Target", self._with_browse(self.target, "Choose the target"))
        form.addRow("Drafter", self._with_browse(self.draft, "Choose the drafter"))
        self.error = warning_label()
        buttons = ok_cancel(self, "Load")
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(buttons)

    @staticmethod
    def _path_field(name: str, hint: str) -> QLineEdit:
        field = QLineEdit()
        field.setAccessibleName(name)
        field.setPlaceholderText(hint)
        return field

    def _with_browse(self, field: QLineEdit, title: str) -> QWidget:
        """The field with "File…" (a GGUF) and "Folder…" buttons."""
        row = QWidget()
        box = QHBoxLayout(row)
        box.setContentsMargins(0, 0, 0, 0)
        box.addWidget(field, 1)
        for label, pick in (("File…", lambda: QFileDialog.getOpenFileName(self, title, "", "GGUF models (*.gguf)")[0]),
                            ("Folder…", lambda: QFileDialog.getExistingDirectory(self, title))):
            button = QPushButton(label)
            button.clicked.connect(lambda _=False, pick=pick: (chosen := pick()) and field.setText(chosen))
            box.addWidget(button)
        return row

    def _path(self, field: QLineEdit, what: str, required: bool) -> Path | None:
        text = field.text().strip()
        if not text:
            if required:
                raise ValueError(f"Choose the {what}: a GGUF file or a model folder.")
            return None
        path = Path(text).expanduser()
        if not path.exists():
            raise ValueError(f"The {what} {path} does not exist. Check the path, or use File… or Folder….")
        if path.is_file() and path.suffix.lower() != ".gguf":
            raise ValueError(f"The {what} {path.name} is a file but not a GGUF model; for safetensors, choose "
                             "the folder that holds it and its config.json.")
        return path.resolve()

    def accept(self) -> None:
        try:
            self.target_path = self._path(self.target, "target", required=True)
            self.draft_path = self._path(self.draft, "drafter", required=False)
        except ValueError as exc:
            self.error.setText(str(exc))
            self.error.show()
            return
        super().accept()

    def pair(self) -> PairRequest:
        """The chosen pair as a load request (its id keeps its baselines apart)."""
        target, draft = self.target_path, self.draft_path
        return PairRequest(f"local:{target}", target.stem if target.is_file() else target.name, str(target),
                           str(draft) if draft else None, plan={**AUTO, "engine": engine_for(target)})
