"""The GUI process must never load torch and friends: importing them costs seconds and gigabytes, and
a broken CUDA or Metal install would take the window down with it. Only the worker may import them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "mlx", "llama_cpp", "triton")

PROBE = r"""
import importlib, json, pkgutil, sys
names = []
for package in ("dflash_desktop", "ui"):
    pkg = importlib.import_module(package)
    names.append(package)
    for info in pkgutil.walk_packages(pkg.__path__, package + "."):
        importlib.import_module(info.name)
        names.append(info.name)
import engine.protocol, engine.worker  # the shared protocol and the worker's own top level stay light
names += ["engine.protocol", "engine.worker"]
heavy = sorted(m for m in sys.modules if m.split(".")[0] in %r)
print(json.dumps({"imported": names, "heavy": heavy}))
""" % (HEAVY,)


def probe(extra_path: str | None = None, prelude: str = "") -> dict:
    path = os.pathsep.join(p for p in (extra_path, str(ROOT)) if p)
    out = subprocess.run([sys.executable, "-c", prelude + PROBE], cwd=ROOT, env=dict(os.environ, PYTHONPATH=path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_gui_packages_import_no_model_runtime():
    result = probe()
    assert "dflash_desktop.worker_client" in result["imported"] and "dflash_desktop.qt_worker" in result["imported"]
    assert result["heavy"] == [], f"GUI-side imports pulled in {result['heavy']}"


def test_probe_would_notice_torch(tmp_path):
    """The check can fail: a (stand-in, instant) torch imported on the way is reported."""
    (tmp_path / "torch.py").write_text("")
    assert probe(str(tmp_path), prelude="import torch\n")["heavy"] == ["torch"]
