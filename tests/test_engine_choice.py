"""The engine-choice policy's rule for a load that replaces a loaded pair (engine/backends/choice.py): the old
pair stays while the new one loads only when both fit in the computer's memory; the worker's side of it (a
failed load leaves the old pair answering) is in tests/test_worker.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.backends.choice import LOAD_GROWTH, KEEP_SHARE, keeps_loaded_pair

MB = 2**20
ROOT = Path(__file__).resolve().parent.parent


def make_model(folder, megabytes: int):
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * (megabytes * MB))
    return folder


def test_a_cpu_pair_stays_while_a_new_one_loads_only_when_both_fit(tmp_path):
    target = make_model(tmp_path / "target", 4)
    cpu = {"device": "cpu", "engine": "torch"}
    fits = int(LOAD_GROWTH["default"] * 5 * MB / KEEP_SHARE)          # room for 5 MB of files, 4 given
    assert keeps_loaded_pair(cpu, "torch", target, available=fits)
    assert not keeps_loaded_pair(cpu, "torch", target, available=fits // 2)
    draft = make_model(tmp_path / "draft", 2)                         # the drafter counts too: 6 MB
    assert not keeps_loaded_pair(cpu, "torch", target, draft, available=fits)


def test_nothing_is_kept_without_a_pair_or_for_a_pair_on_a_gpu(tmp_path):
    target = make_model(tmp_path / "target", 1)
    plenty = 1 << 40
    assert not keeps_loaded_pair(None, "torch", target, available=plenty)
    for device in ("cuda:0", "mps", "gpu"):
        assert not keeps_loaded_pair({"device": device}, "torch", target, available=plenty)


def test_a_gguf_that_torch_unpacks_needs_more_room_than_llama_cpp_maps(tmp_path):
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * (4 * MB))
    room = int(LOAD_GROWTH["llamacpp"] * 5 * MB / KEEP_SHARE)
    assert keeps_loaded_pair({"device": "cpu"}, "llamacpp", gguf, available=room)
    assert not keeps_loaded_pair({"device": "cpu"}, "torch", gguf, available=room)


def fake_torch(root, version: str, cuda: str | None, with_version_py: bool = True):
    """A torch package that leaves a marker when imported, with its version.py and metadata as a wheel has them."""
    package = root / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(root / 'imported')!r}, 'w').close()\n")
    if with_version_py:
        (package / "version.py").write_text(f"from typing import Optional\n__version__ = {version!r}\n"
                                            f"cuda: Optional[str] = {cuda!r}\nhip: Optional[str] = None\n")
    info = root / f"torch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    return root


@pytest.mark.parametrize("version, cuda, with_version_py, expected", [
    ("2.13.0", None, True, False),          # PyPI's Windows wheel: CPU-only, no "+cpu" in its version
    ("2.13.0+cpu", None, True, False),      # PyTorch's CPU index
    ("2.13.0", "12.8", True, True),         # PyPI's Linux wheel, with CUDA
    ("2.13.0+cpu", None, False, False),     # a frozen app: modules in an archive, the metadata bundled
    ("2.13.0", None, False, True),          # neither says: PyTorch is asked
])
def test_whether_pytorch_may_see_a_gpu_is_read_from_its_files_without_importing_it(tmp_path, version, cuda,
                                                                                    with_version_py, expected):
    if sys.platform == "darwin":
        pytest.skip("on macOS PyTorch is always asked (MPS)")
    root = fake_torch(tmp_path / "site", version, cuda, with_version_py)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)]),
           "DFLASH_DESKTOP_HOME": str(tmp_path / "home")}
    code = "from engine.backends.choice import _torch_may_see_a_gpu; print(_torch_may_see_a_gpu())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(expected)]
    assert not (root / "imported").exists(), "PyTorch was imported to answer"
