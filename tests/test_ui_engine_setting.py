"""The settings offer the engine where more than one can run the loaded pair from its folders."""
import pytest

from dflash_desktop.catalog import load_catalog
from dflash_desktop.run_plan import engine_choices
from dflash_desktop.settings import Settings, SettingsError
from ui.settings_dialog import SettingsDialog

from .ui_chat_fixtures import LOAD_TIMEOUT_MS, chat_worker, echo_pair, home, make_window  # noqa: F401


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


def test_switching_the_engine_setting_back_restores_the_pickers_plan(qtbot, home, chat_worker, echo_pair):
    """The picker's plan (here float32 on the CPU; on a small GPU a quantized target) comes back when the
    setting returns to automatic, instead of the worker's default weights."""
    planned = {"engine": "torch", "device": "cpu", "dtype": "float32"}
    window = make_window(qtbot, chat_worker, {**echo_pair, "plan": planned, "planned": planned},
                         Settings(engine="torch", max_new_tokens=4))
    assert window.session.pair.plan == planned
    with qtbot.waitSignal(window.session.pairLoaded, timeout=LOAD_TIMEOUT_MS):
        window.apply_settings(Settings(engine="auto", max_new_tokens=4))
    assert window.session.pair.plan == planned and window.session.loaded.dtype == "float32"
    assert window.with_engine({**echo_pair, "planned": planned}).plan == planned
    window.settings.engine = "llamacpp"          # not able to run this pair's folders: the plan stays
    assert window.with_engine({**echo_pair, "plan": planned, "planned": planned}).plan == planned
