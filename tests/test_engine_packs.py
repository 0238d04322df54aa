"""Engine packs (engine/packs.py): the engine process finds a pack under its packs root, prefers the pack's
libraries over the bundled ones, and leaves out a broken pack with a sentence that says why. The pack in
the worker test is real: its site-packages holds this environment's own torch (a link), which is what a
CUDA pack's torch would be to the app; the download of the real CUDA build cannot happen here."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dflash_desktop.worker_client import WorkerClient, worker_env
from engine import packs

T = 120


def make_pack(root: Path, name: str = "cuda", provides=("torch",), **overrides) -> Path:
    folder = root / name
    site = folder / "site-packages"
    site.mkdir(parents=True)
    for module in provides:
        (site / module).mkdir()
        (site / module / "__init__.py").write_text("")
    manifest = {"format": packs.FORMAT, "name": name, "title": "CUDA engine", "provides": list(provides),
                "python": packs.this_python(), "platform": packs.this_platform(), "api": packs.API, **overrides}
    (folder / packs.MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_a_valid_pack_is_chosen(tmp_path):
    folder = make_pack(tmp_path)
    choice = packs.choose(tmp_path)
    assert [p["name"] for p in choice.active] == ["cuda"] and choice.notes == []
    assert choice.active[0]["path"] == str(folder / "site-packages")


def test_no_root_or_an_empty_root_chooses_nothing(tmp_path):
    assert packs.choose(None).active == [] and packs.choose(tmp_path / "missing").active == []
    assert packs.choose(tmp_path).notes == []


@pytest.mark.parametrize("breakage, says", [
    ("no manifest", "not installed completely"),
    ("bad json", "unreadable"),
    ("other python", "made for python '2.7'"),
    ("other platform", "made for platform 'plan9-mips'"),
    ("other app", "made for api 999"),
    ("module missing", "lacks torch"),
    ("nothing provided", "does not list the modules"),
])
def test_a_broken_pack_is_left_out_with_the_reason(tmp_path, breakage, says):
    overrides = {"other python": {"python": "2.7"}, "other platform": {"platform": "plan9-mips"},
                 "other app": {"api": 999}, "nothing provided": {"provides": []}}.get(breakage, {})
    folder = make_pack(tmp_path, **overrides)
    if breakage == "no manifest":
        (folder / packs.MANIFEST).unlink()
    elif breakage == "bad json":
        (folder / packs.MANIFEST).write_text("{not json")
    elif breakage == "module missing":
        (folder / "site-packages" / "torch" / "__init__.py").unlink()
        (folder / "site-packages" / "torch").rmdir()
    choice = packs.choose(tmp_path)
    assert choice.active == []
    assert len(choice.notes) == 1 and str(folder) in choice.notes[0] and says in choice.notes[0]
    assert "built-in engine runs instead" in choice.notes[0]


def test_two_packs_for_the_same_module_the_first_by_name_wins(tmp_path):
    make_pack(tmp_path, "a-cuda")
    make_pack(tmp_path, "b-other")
    make_pack(tmp_path, "c-gguf", provides=("llama_cpp",))
    choice = packs.choose(tmp_path)
    assert [p["name"] for p in choice.active] == ["a-cuda", "c-gguf"]
    assert len(choice.notes) == 1 and "a-cuda pack already provides torch" in choice.notes[0]


def worker_events(root: Path, home: Path) -> tuple[dict, dict]:
    """hello and hardware events of a real worker started with this packs root."""
    client = WorkerClient(env=worker_env({**os.environ, packs.ROOT_ENV: str(root), "DFLASH_DESKTOP_HOME": str(home)}))
    try:
        client.start()
        hardware = client.wait(client.hardware(), T)   # answered after hello
        return client.hello_info, hardware
    finally:
        client.shutdown(10)


def test_worker_prefers_the_packs_torch(tmp_path):
    import importlib.util
    real_torch = Path(importlib.util.find_spec("torch").origin).parent
    folder = tmp_path / "packs" / "cuda"
    (folder / "site-packages").mkdir(parents=True)
    (folder / "site-packages" / "torch").symlink_to(real_torch, target_is_directory=True)
    (folder / packs.MANIFEST).write_text(json.dumps({
        "format": packs.FORMAT, "name": "cuda", "provides": ["torch"], "python": packs.this_python(),
        "platform": packs.this_platform(), "api": packs.API}))
    hello, hardware = worker_events(tmp_path / "packs", tmp_path / "home")
    assert hello["engine_packs"]["active"] == ["cuda"] and hello["engine_packs"]["notes"] == []
    torch_file = hardware["engine_packs"]["modules"]["torch"]
    assert torch_file == str(folder / "site-packages" / "torch" / "__init__.py"), torch_file
    assert hardware["engines"]["torch"]["version"].startswith("2."), "the engine runs on the pack's torch"


def test_worker_ignores_a_broken_pack_and_runs_its_own_engine(tmp_path):
    make_pack(tmp_path / "packs", python="2.7")
    hello, hardware = worker_events(tmp_path / "packs", tmp_path / "home")
    assert hello["engine_packs"]["active"] == [] and "made for python '2.7'" in hello["engine_packs"]["notes"][0]
    assert hardware["engine_packs"]["modules"] == {} and hardware["engines"]["torch"]["version"].startswith("2.")
