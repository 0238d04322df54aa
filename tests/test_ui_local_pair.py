"""The "Open a model from disk" dialog, a real Qt dialog: paths that do not exist or are not models are
refused in the dialog with what to do; a folder and a GGUF file become a pair for the right engine."""
from ui.local_pair_dialog import LocalPairDialog, engine_for


def test_a_missing_target_is_refused_in_the_dialog(qtbot, tmp_path):
    dialog = LocalPairDialog()
    qtbot.addWidget(dialog)
    dialog.accept()
    assert not dialog.error.isHidden() and "Choose the target" in dialog.error.text()
    dialog.target.setText(str(tmp_path / "nowhere.gguf"))
    dialog.accept()
    assert "does not exist" in dialog.error.text() and dialog.result() == 0
    (tmp_path / "notes.txt").write_text("hello")
    dialog.target.setText(str(tmp_path / "notes.txt"))
    dialog.accept()
    assert "not a GGUF model" in dialog.error.text()


def test_a_gguf_file_goes_to_llamacpp_and_a_folder_to_the_workers_choice(qtbot, tmp_path):
    gguf = tmp_path / "Model-Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF")                  # the engine reads it; the dialog only needs it to exist
    folder = tmp_path / "qwen3"
    folder.mkdir()
    dialog = LocalPairDialog()
    qtbot.addWidget(dialog)
    dialog.target.setText(str(gguf))
    dialog.draft.setText(str(folder))
    dialog.accept()
    assert dialog.result() == 1
    pair = dialog.pair()
    assert pair.target_dir == str(gguf) and pair.draft_dir == str(folder) and pair.name == "Model-Q4_K_M"
    assert pair.plan["engine"] == "llamacpp" and pair.id.startswith("local:")
    assert engine_for(folder) == "auto"
    (folder / "x.gguf").write_bytes(b"GGUF")
    assert engine_for(folder) == "llamacpp"


def test_models_open_from_disk_loads_the_pair_in_the_real_worker(qtbot, tmp_path, monkeypatch):
    """Models… > Open from disk… with the demo pair's folders: the window's real worker loads them and the
    pair is remembered under its own local id."""
    from PySide6.QtWidgets import QDialogButtonBox

    from dflash_desktop import settings as settings_mod
    from dflash_desktop.chat_store import ChatStore
    from dflash_desktop.qt_worker import QtWorker
    from engine.bench import DEMO_DIR
    from ui.main_window import MainWindow
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    worker = QtWorker()
    window = MainWindow(worker=worker, store=ChatStore(), settings=settings_mod.Settings(), autoload=False)
    qtbot.addWidget(window)
    window.show()
    try:
        dialog = window.open_model_picker().open_local()
        dialog.target.setText(str(DEMO_DIR / "target"))
        dialog.draft.setText(str(DEMO_DIR / "draft"))
        with qtbot.waitSignal(window.session.pairLoaded, timeout=180_000):
            dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
        assert window.session.pair.id == f"local:{(DEMO_DIR / 'target').resolve()}"
        assert window.session.loaded.has_drafter
        assert window._served_name() is None     # the local server names it "target", not by its path
    finally:
        worker.shutdown(10)
