"""A GGUF file as a Hugging Face folder, for the engines that read safetensors (torch, MLX).

llama.cpp runs a GGUF as it is. The torch and MLX engines need config.json, safetensors and tokenizer files:
transformers' GGUF reader (the `gguf` package) dequantizes the weights and rebuilds the tokenizer and chat
template from the file's metadata, and a plain model of the same class saves them (transformers refuses to
save a model it loaded from a GGUF). Made once per file into the app's cache, beside its final place, and
renamed there when complete; no code from anywhere near the file runs.
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from .cache_dir import app_cache
from .errors import CheckpointError

FLOAT32_LIMIT = 4 << 30     # bytes of float32 weights above which the folder keeps bfloat16 instead


def unpackable_architecture(gguf: Path) -> str | None:
    """The file's architecture where transformers' GGUF reader knows it (a DFlash drafter's it does not), else
    None."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    from . import gguf_metadata as metadata
    try:
        arch = metadata.architecture(metadata.read_metadata(Path(gguf)))
    except Exception:  # noqa: BLE001 (a damaged file: its load says what is wrong)
        return None
    return arch if arch in GGUF_CONFIG_MAPPING and arch not in ("general", "tokenizer") else None


def key_of(gguf: Path) -> str:
    """The file by name, size and modification time (hashing gigabytes at every load would cost seconds)."""
    st = gguf.stat()
    return hashlib.sha256(f"{gguf.name}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:12]


def hf_folder(gguf: Path, progress: Callable[[str, str], None] | None = None) -> Path:
    """The cached Hugging Face folder of this GGUF, made on first use."""
    gguf = Path(gguf)
    dest = app_cache() / "models" / f"{gguf.stem}-{key_of(gguf)}"
    if (dest / "config.json").is_file():
        return dest
    if unpackable_architecture(gguf) is None:
        raise CheckpointError(f"{gguf.name} is a GGUF that only llama.cpp runs (transformers cannot unpack its "
                              "architecture for the PyTorch or MLX engine): choose the llama.cpp engine, or use "
                              "the model's Hugging Face folder.")
    if progress is not None:
        progress("convert", f"Preparing {gguf.name} for this engine (once: its weights are unpacked)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{gguf.stem}-", dir=dest.parent))
    try:
        _make(gguf, tmp)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _make(gguf: Path, dest: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    dtype = torch.float32 if gguf.stat().st_size * 8 <= FLOAT32_LIMIT else torch.bfloat16   # ~4 bits a weight
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype,
                                                      trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 (transformers' GGUF reader raises many kinds for files it only half knows)
        raise CheckpointError(f"{gguf.name} cannot be unpacked for the PyTorch or MLX engine ({type(exc).__name__}: "
                              f"{str(exc)[:300]}). Run it with the llama.cpp engine, or use the model's Hugging Face "
                              "folder.") from None
    cls = type(loaded)
    config = loaded.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "transformers_version"):
        config.pop(key, None)
    plain = cls(cls.config_class(**config)).to(dtype)
    plain.load_state_dict(loaded.state_dict())
    plain.config.name_or_path = gguf.stem
    plain.generation_config.eos_token_id = tokenizer.eos_token_id
    plain.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
