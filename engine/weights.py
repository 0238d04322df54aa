"""What a model folder holds, read from the safetensors headers alone (a few kilobytes, no tensor data),
so a config that does not match its weights, or weights that cannot fit, are refused before anything
is built or allocated. The format is a little-endian u64 header length, then that many bytes of JSON
mapping tensor names to dtype, shape and offsets. Pure standard library."""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

from .errors import CheckpointError

MAX_HEADER_BYTES = 100 << 20
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
               "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class Tensor:
    file: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return prod(self.shape)


def _raw_header(path: Path) -> tuple[dict, int]:
    """The header's JSON object and the offset where the tensor data starts."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (0,)
            if not 0 < length <= MAX_HEADER_BYTES:
                raise CheckpointError(f"Weights file {path} is truncated or corrupt (no valid safetensors header). "
                                      "Delete it and download it again.")
            header = json.loads(f.read(length))
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be read ({exc.strerror or exc}).") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointError(f"Weights file {path} is truncated or corrupt ({exc}). "
                              "Delete it and download it again.") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"Weights file {path} is corrupt (its header is not a JSON object). "
                              "Delete it and download it again.")
    return header, 8 + length


def _span(path: Path, header: dict, start: int, name: str) -> tuple[int, int]:
    """Where a tensor's bytes lie in its file, checked against the file's size."""
    offsets = header[name].get("data_offsets") if isinstance(header.get(name), dict) else None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1] and start + offsets[1] <= path.stat().st_size):
        raise CheckpointError(f"Weights file {path} is truncated or corrupt (tensor {name!r} lies outside it). "
                              "Delete it and download it again.")
    return start + offsets[0], start + offsets[1]


def read_ints(path: Path, name: str, most: int) -> list[int]:
    """A small integer tensor's values (a vocabulary table of at most `most`), read with the standard library."""
    header, start = _raw_header(path)
    tensor = _tensors(path, header).get(name)
    codes = {"I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B", "U16": "H", "U32": "I", "U64": "Q"}
    if tensor is None or tensor.dtype not in codes or len(tensor.shape) != 1 or tensor.numel > most:
        raise CheckpointError(f"{path}: {name} must be a list of at most {most} integers, found "
                              f"{'nothing' if tensor is None else f'{tensor.dtype} {list(tensor.shape)}'}.")
    begin, end = _span(path, header, start, name)
    if end - begin != tensor.numel * DTYPE_BYTES[tensor.dtype]:
        raise CheckpointError(f"Weights file {path} is corrupt ({name} has the wrong byte count). Download it again.")
    with open(path, "rb") as f:
        f.seek(begin)
        return list(struct.unpack(f"<{tensor.numel}{codes[tensor.dtype]}", f.read(end - begin)))


def spread_rows(path: Path, name: str, rows: list[int], total: int, out: Path) -> None:
    """A safetensors file holding tensor `name` of `path`, whose row i is written at row rows[i] of `total` rows,
    zeros elsewhere: a drafter's table over a subset of its target's vocabulary made whole."""
    header, start = _raw_header(path)
    tensor = _tensors(path, header).get(name)
    if tensor is None or not tensor.shape or tensor.shape[0] != len(rows) or tensor.dtype not in DTYPE_BYTES:
        raise CheckpointError(f"{path}: {name} must have a row for each of the drafter's {len(rows)} tokens, found "
                              f"{'nothing' if tensor is None else f'{tensor.dtype} {list(tensor.shape)}'}. "
                              "Re-download the drafter.")
    begin, end = _span(path, header, start, name)
    width = tensor.numel // len(rows) * DTYPE_BYTES[tensor.dtype]
    if end - begin != width * len(rows):
        raise CheckpointError(f"Weights file {path} is corrupt ({name} has the wrong byte count). Download it again.")
    with open(path, "rb") as f:
        f.seek(begin)
        data = f.read(end - begin)
    whole = bytearray(width * total)
    for i, row in enumerate(rows):
        whole[row * width:(row + 1) * width] = data[i * width:(i + 1) * width]
    entry = {name: {"dtype": tensor.dtype, "shape": [total, *tensor.shape[1:]], "data_offsets": [0, len(whole)]}}
    Path(out).write_bytes(_header_bytes(entry) + bytes(whole))


def _header_bytes(entries: dict) -> bytes:
    """A safetensors file's start: the header's length, then its JSON padded to a multiple of 8 bytes."""
    blob = json.dumps(entries, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob


def copy_tensors(folder: Path, names: list[str], out: Path, chunk: int = 64 << 20) -> None:
    """A safetensors file holding the named tensors of a folder's files, their bytes copied as they are."""
    sources = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        header, start = _raw_header(path)
        for name, tensor in _tensors(path, header).items():
            sources[name] = (path, header, start, tensor)
    entries, spans, offset = {}, [], 0
    for name in names:
        if name not in sources:
            raise CheckpointError(f"No weights file in {folder} holds {name}. Re-download the model.")
        path, header, start, tensor = sources[name]
        begin, end = _span(path, header, start, name)
        if end - begin != tensor.numel * DTYPE_BYTES.get(tensor.dtype, 0):
            raise CheckpointError(f"Weights file {path} is corrupt ({name}'s bytes do not match its shape "
                                  f"{list(tensor.shape)} of {tensor.dtype}). Download it again.")
        entries[name] = {"dtype": tensor.dtype, "shape": list(tensor.shape),
                         "data_offsets": [offset, offset + end - begin]}
        spans.append((path, begin, end))
        offset += end - begin
    with open(out, "wb") as dst:
        dst.write(_header_bytes(entries))
        for path, begin, end in spans:
            with open(path, "rb") as src:
                src.seek(begin)
                while begin < end:
                    data = src.read(min(chunk, end - begin))
                    if not data:
                        raise CheckpointError(f"Weights file {path} ended early. Download it again.")
                    dst.write(data)
                    begin += len(data)


def read_header(path: Path) -> dict[str, Tensor]:
    """Tensor name -> (file, dtype, shape), or CheckpointError naming the file and what is wrong."""
    return _tensors(path, _raw_header(path)[0])


def _tensors(path: Path, header: dict) -> dict[str, Tensor]:
    """A parsed header's tensors, each shape checked."""
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise CheckpointError(f"{path}: tensor {name!r} has no valid shape. Download the file again.")
        out[name] = Tensor(path.name, str(entry.get("dtype")), tuple(shape))
    return out


def folder_tensors(folder: Path) -> dict[str, Tensor]:
    """Every tensor of every *.safetensors file in a folder, from the headers."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
        hint = (f" It has {', '.join(pickles)}: pickled weights are never loaded, because unpickling can run "
                "code." if pickles else "")
        raise CheckpointError(f"No *.safetensors weights in {folder}.{hint} Re-download the model.")
    tensors: dict[str, Tensor] = {}
    for f in files:
        tensors.update(read_header(f))
    return tensors


def layer_count(tensors: dict[str, Tensor], prefix: str = "") -> int:
    """1 + the highest `layers.N.` index among tensor names starting with prefix (0 when none)."""
    ids = [int(m.group(1)) for name in tensors if name.startswith(prefix) and (m := _LAYER.search(name))]
    return max(ids) + 1 if ids else 0


class ByName:
    """What a drafter module that loads by tensor name (torch's and MLX's) says of a checkpoint's tensors: the module
    to build for them, how many decoder layers they hold, and a tensor's name as the module calls it. A drafter
    whose parts are optional, or whose exports spell names otherwise, says it differently (eagle3_config.Loading)."""

    @classmethod
    def shaped(cls, cfg, header: dict):
        return cls(cfg)

    @staticmethod
    def layers_in(header: dict) -> int:
        return layer_count(header)

    @staticmethod
    def renamed(name: str) -> str:
        return name


def bytes_as(tensors: dict[str, Tensor], dtype_bytes: int, linear_bytes: float | None = None) -> int:
    """Memory the floating-point tensors take once loaded in a dtype of this many bytes; with linear_bytes,
    the decoder layers' matrices take that many instead (quantized while loading)."""
    def size(name: str, t: Tensor) -> float:
        if not t.dtype.startswith(("F", "BF")):
            return t.numel * DTYPE_BYTES.get(t.dtype, 1)
        if linear_bytes is not None and ".layers." in f".{name}" and len(t.shape) == 2:
            return t.numel * linear_bytes
        return t.numel * dtype_bytes
    return int(sum(size(name, t) for name, t in tensors.items()))


def config_int(cfg: dict, key: str, source: str, low: int = 1, high: int = 1 << 24) -> int:
    """cfg[key] as a whole number in [low, high], or CheckpointError naming the key and the file."""
    return whole(cfg.get(key), key, source, low, high)


def whole(value, name: str, source: str, low: int = 1, high: int = 1 << 24) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CheckpointError(f"{source}: {name} must be a whole number from {low:,} to {high:,}, got {value!r}. "
                              "The file is damaged or not a model config; re-download it.")
    return value


def real(value, name: str, source: str, low: float, high: float) -> float:
    """A finite number above low (excluded) and at most high, or CheckpointError naming it and the file."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
        raise CheckpointError(f"{source}: {name} must be a number above {low:g} and at most {high:g}, got {value!r}. "
                              "The file is damaged or not a model config; re-download it.")
    return float(value)


def check_fits(needed: int, available: int | None, what: str) -> None:
    if available is not None and needed > available:
        raise CheckpointError(f"{what} needs about {needed / 1e9:.1f} GB but only {available / 1e9:.1f} GB is "
                              "free on this device. Close other programs, or pick a smaller model.",
                              code="out_of_memory")


def check_target(folder: Path, dtype_bytes: int, available: int | None, linear_bytes: float | None = None) -> None:
    """A target folder's config.json against its weights' headers and the free memory, before any loader
    builds a model from the config: a damaged number names its key, a config that disagrees with the
    weights names both, and weights that cannot fit say how much they need."""
    folder = Path(folder)
    source = str(folder / "config.json")
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except OSError as exc:
        raise CheckpointError(f"{source} cannot be read ({exc.strerror or exc}).") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{source} is not valid JSON ({exc}). Re-download the model.") from None
    text = cfg.get("text_config") if isinstance(cfg, dict) and isinstance(cfg.get("text_config"), dict) else cfg
    if not isinstance(text, dict):
        raise CheckpointError(f"{source} must hold a JSON object. Re-download the model.")
    layers = config_int(text, "num_hidden_layers", source, 1, 1024)
    hidden = config_int(text, "hidden_size", source, 1, 1 << 17)
    config_int(text, "vocab_size", source, 1, 1 << 23)
    tensors = folder_tensors(folder)
    embed = next((n for n in sorted(tensors) if n.endswith("embed_tokens.weight")), None)
    if embed is not None:
        width = tensors[embed].shape[-1] if tensors[embed].shape else None
        if width and tensors[embed].dtype == "U32":   # MLX-quantized: `bits`-bit values packed in 32-bit words
            width = width * 32 // packed_bits(cfg, embed.removesuffix(".weight"), source)
        if width != hidden:
            raise CheckpointError(f"{source} says hidden_size {hidden:,}, but {embed} in {tensors[embed].file} is "
                                  f"{width} wide: config and weights do not belong together. Re-download the model.")
        found = layer_count(tensors, embed.removesuffix("embed_tokens.weight"))
        if found != layers:
            raise CheckpointError(f"{source} says num_hidden_layers {layers:,}, but the weights hold {found} decoder "
                                  "layers: config and weights do not belong together. Re-download the model.")
    check_fits(bytes_as(tensors, dtype_bytes, linear_bytes), available, "The target model")


def packed_bits(cfg: dict, module: str, source: str) -> int:
    """The bits of an MLX-quantized module: its own entry in config.json's `quantization`, else the default."""
    quant = cfg.get("quantization") if isinstance(cfg.get("quantization"), dict) else {}
    entry = quant.get(module) if isinstance(quant.get(module), dict) else quant
    return whole(entry.get("bits"), "quantization.bits", source, 1, 16)


def draft_value(raw: dict[str, Any], name: str, default: Any = None) -> Any:
    """A DFlash setting as the reference reads it: dflash_config first, then the top level."""
    nested = raw.get("dflash_config") or {}
    return nested[name] if name in nested else raw.get(name, default)
