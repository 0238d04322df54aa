"""Engine packs (engine/packs.py): the engine process finds a pack under its packs root, prefers the pack's
libraries over the bundled ones, and leaves out a broken pack with a sentence that says why. The pack in
the worker test is real: its site-packages holds this environment's own torch (hard links to its files),
which is what a CUDA pack's torch would be to the app; the download of the real CUDA build cannot happen
here. The hostile packs are real folders too: deep or huge pack.json, modules they do not declare (numpy,
ctypes), links out of the pack and world-writable files."""
from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_desktop.worker_client import WorkerClient, worker_env
from engine import packs

T = 120
EXT = importlib.machinery.EXTENSION_SUFFIXES[0]  # .cpython-311-x86_64-linux-gnu.so, .cp311-win_amd64.pyd...


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


def left_out(root: Path, folder: Path, says: str) -> str:
    """The one note for a pack that is not used; it names the pack and the problem."""
    choice = packs.choose(root)
    assert choice.active == [], choice.active
    assert len(choice.notes) == 1 and str(folder) in choice.notes[0] and says in choice.notes[0], choice.notes
    return choice.notes[0]


posix_only = pytest.mark.skipif(os.name != "posix", reason="world-writable is a POSIX mode bit")


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


@pytest.mark.parametrize("content, says", [
    ("[" * 50_000, "nested too deeply"),
    ('{"format": 1, "pad": "' + "x" * 70_000 + '"}', "larger than 65,536 bytes"),
    (b"\xff\xfe{}", "unreadable"),
], ids=["deep", "huge", "not utf-8"])
def test_a_deep_or_huge_pack_json_is_left_out_naming_the_pack(tmp_path, content, says):
    """A pack.json nested 50,000 deep raised RecursionError out of choose(), and the engine died at every start."""
    folder = make_pack(tmp_path)
    manifest = folder / packs.MANIFEST
    manifest.write_bytes(content) if isinstance(content, bytes) else manifest.write_text(content)
    note = left_out(tmp_path, folder, says)
    assert "built-in engine runs instead" in note


def test_the_packs_after_a_broken_one_are_still_chosen(tmp_path):
    make_pack(tmp_path, "a-deep")
    (tmp_path / "a-deep" / packs.MANIFEST).write_text("[" * 50_000)
    make_pack(tmp_path, "b-cuda")
    choice = packs.choose(tmp_path)
    assert [p["name"] for p in choice.active] == ["b-cuda"]
    assert len(choice.notes) == 1 and "a-deep" in choice.notes[0]


@pytest.mark.parametrize("extra, names", [
    (("numpy/__init__.py", "ctypes/__init__.py"), "ctypes/ (part of Python), numpy/"),
    (("json.py",), "json.py (part of Python)"),
    (("yaml" + EXT,), "yaml" + EXT),
    (("sitecustomize.pyc",), "sitecustomize.pyc"),
    (("nvidia/cublas/__init__.py",), "nvidia/"),   # a namespace package counts too
], ids=["numpy and ctypes", "json.py", "extension module", "bytecode", "namespace package"])
def test_a_pack_that_ships_modules_it_does_not_declare_is_left_out(tmp_path, extra, names):
    """A test pack that provides torch also replaced numpy and ctypes, and was used."""
    folder = make_pack(tmp_path)
    for name in extra:
        (folder / "site-packages" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "site-packages" / name).write_text("")
    left_out(tmp_path, folder, f"also holds {names}, which its pack.json does not declare")


@pytest.mark.parametrize("provides", [("torch", "ctypes"), ("os",), ("engine",), ("dflash_desktop",)],
                         ids=["torch and ctypes", "os", "engine", "dflash_desktop"])
def test_a_pack_may_not_provide_python_or_the_app_even_when_declared(tmp_path, provides):
    folder = make_pack(tmp_path, provides=provides)
    left_out(tmp_path, folder, "part of Python or of the app itself")


def test_files_import_cannot_reach_are_allowed(tmp_path):
    """What unpacked wheels hold besides their modules: metadata, bytecode caches, bundled libraries."""
    folder = make_pack(tmp_path, provides=("torch", "torchgen"))
    site = folder / "site-packages"
    for name in ("torch-2.5.0.dist-info/METADATA", "torch.libs/libgomp.so.1", "__pycache__/x.cpython-311.pyc",
                 "README.txt", "distutils-precedence.pth", "torchgen/__init__.py"):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text("")
    assert [p["name"] for p in packs.choose(tmp_path).active] == ["cuda"]


def test_activating_a_pack_cannot_replace_python_or_numpy(tmp_path):
    """The engine process itself: after activate(), ctypes and numpy still come from Python and the environment."""
    folder = make_pack(tmp_path)
    for module in ("numpy", "ctypes"):
        (folder / "site-packages" / module).mkdir()
        (folder / "site-packages" / module / "__init__.py").write_text("raise SystemExit('the pack ran')")
    code = ("import sys; from pathlib import Path; from engine import packs; c = packs.activate(Path(sys.argv[1])); "
            "import ctypes, numpy; print(c.active, ctypes.__file__, numpy.__file__)")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=T)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("[] ") and str(tmp_path) not in out.stdout, out.stdout


@pytest.mark.parametrize("link", ["folder", "pack.json", "module file", "module folder"])
def test_a_link_out_of_the_pack_is_refused(tmp_path, link):
    root, outside = tmp_path / "packs", tmp_path / "elsewhere"
    root.mkdir()
    real = make_pack(outside)
    if link == "folder":
        (root / "cuda").symlink_to(real, target_is_directory=True)
        left_out(root, root / "cuda", f"its folder is a link to {real}, outside")
        return
    folder = make_pack(root)
    if link == "pack.json":
        target, path = real / packs.MANIFEST, folder / packs.MANIFEST
    elif link == "module file":
        target = real / "site-packages" / "torch" / "__init__.py"
        path = folder / "site-packages" / "torch" / "__init__.py"
    else:
        target, path = real / "site-packages" / "torch", folder / "site-packages" / "torch"
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.symlink_to(target, target_is_directory=target.is_dir())
    left_out(root, folder, f"{path} is a link to {target}, outside the pack")


def test_a_link_that_stays_inside_the_pack_is_allowed(tmp_path):
    folder = make_pack(tmp_path)
    torch = folder / "site-packages" / "torch"
    (torch / "lib").mkdir()
    (torch / "lib" / "libtorch.so.2").write_text("")
    (torch / "lib" / "libtorch.so").symlink_to("libtorch.so.2")
    assert [p["name"] for p in packs.choose(tmp_path).active] == ["cuda"]


@posix_only
@pytest.mark.parametrize("where", ["root", "pack folder", "site-packages", "module file", "pack.json"])
def test_a_world_writable_pack_is_refused_with_how_to_fix_it(tmp_path, where):
    root = tmp_path / "packs"
    folder = make_pack(root)
    path = {"root": root, "pack folder": folder, "site-packages": folder / "site-packages",
            "module file": folder / "site-packages" / "torch" / "__init__.py",
            "pack.json": folder / packs.MANIFEST}[where]
    path.chmod(path.stat().st_mode | 0o002)
    choice = packs.choose(root)
    assert choice.active == [] and len(choice.notes) == 1, choice.notes
    note = choice.notes[0]
    assert "world-writable" in note and "chmod" in note and "o-w" in note, note
    assert str(root if where == "root" else folder) in note


def worker_events(root: Path, home: Path) -> tuple[dict, dict]:
    """hello and hardware events of a real worker started with this packs root."""
    client = WorkerClient(env=worker_env({**os.environ, packs.ROOT_ENV: str(root), "DFLASH_DESKTOP_HOME": str(home)}))
    try:
        client.start()
        hardware = client.wait(client.hardware(), T)   # answered after hello
        return client.hello_info, hardware
    finally:
        client.shutdown(10)


def link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copy2(src, dst)


def test_worker_prefers_the_packs_torch(tmp_path):
    import importlib.util
    real_torch = Path(importlib.util.find_spec("torch").origin).parent
    folder = tmp_path / "packs" / "cuda"
    (folder / "site-packages").mkdir(parents=True)
    # the pack's own files (a link out of the pack is refused): hard links where the file system allows them
    shutil.copytree(real_torch, folder / "site-packages" / "torch", symlinks=True, copy_function=link_or_copy)
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


def test_worker_starts_with_a_pack_json_nested_too_deeply(tmp_path):
    """It died at every start (RecursionError before hello), and no message named the pack."""
    folder = make_pack(tmp_path / "packs")
    (folder / packs.MANIFEST).write_text("[" * 50_000)
    hello, hardware = worker_events(tmp_path / "packs", tmp_path / "home")
    notes = hello["engine_packs"]["notes"]
    assert hello["engine_packs"]["active"] == [] and len(notes) == 1, notes
    assert str(folder) in notes[0] and "nested too deeply" in notes[0]
    assert hardware["engines"]["torch"]["version"].startswith("2.")
