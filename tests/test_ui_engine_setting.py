"""The settings offer the engine where more than one can run the loaded pair from its folders."""
import pytest

from dflash_desktop.catalog import load_catalog
from dflash_desktop.run_plan import engine_choices
from dflash_desktop.settings import Settings, SettingsError
from ui.settings_dialog import SettingsDialog


def test_the_engine_row_appears_with_two_engines_and_its_choice_is_kept(qtbot):
    dialog = SettingsDialog(Settings(), 16, engines=[("torch", "PyTorch"), ("llamacpp", "llama.cpp")])
    qtbot.addWidget(dialog)
    assert dialog.engine.parent() is not None and dialog.engine.count() == 3
    dialog.engine.setCurrentIndex(2)
    assert dialog.values().engine == "llamacpp"
    single = SettingsDialog(Settings(engine="torch"), 16, engines=[("torch", "PyTorch")])
    qtbot.addWidget(single)
    single.show()
    assert not single.engine.isVisibleTo(single) and single.values().engine == "torch"


def test_engine_choices_follow_the_catalog_the_build_and_the_variants():
    cat = load_catalog(prefer_refreshed=False)
    assert engine_choices(cat.demo, "torch", "cpu", {}) == ["llamacpp", "torch"]
    assert engine_choices(cat.demo, "torch", "cpu", {"llamacpp": "not built"}) == ["torch"]
    assert engine_choices(cat.demo, "torch", "cuda", {}) == ["llamacpp", "torch"]
    # a GGUF variant's folder holds no safetensors: the torch engine cannot load it
    assert engine_choices(cat.get("qwen3-4b"), "llamacpp", "cpu", {}) == ["llamacpp"]


def test_an_unknown_engine_setting_is_refused():
    with pytest.raises(SettingsError, match="Engine must be automatic"):
        Settings(engine="warp").validate()
