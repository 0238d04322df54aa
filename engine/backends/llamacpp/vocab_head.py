"""A DFlash drafter GGUF that drafts over a frequency-ranked subset of the vocabulary (engine/draft_vocab.py).

llama.cpp's DFlash drafter already takes its own LM head of K rows with a `d2t` table (the target token id of
each row, int64), as EAGLE-3's does: its draft logits then cost K rows instead of the whole vocabulary, and the
ids are mapped back before drafting (src/models/dflash.cpp in the pinned source). Our drafters share the
target's head, so their GGUF has none; this writes a copy of the drafter's GGUF with the target's head rows of
the K most frequent tokens as `output.weight` (float16) and `d2t`. Made once per size, in the app's cache."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ...cache_dir import app_cache
from ...errors import CheckpointError


def subset_gguf(drafter: Path, rows: np.ndarray, ids: tuple[int, ...], out: Path) -> Path:
    """Write `out`: the drafter GGUF's metadata and tensors, plus `output.weight` = rows (the target's head rows
    of `ids`, [K, H]) and `d2t` = ids."""
    import gguf
    reader = gguf.GGUFReader(str(drafter))
    names = {t.name for t in reader.tensors}
    if "output.weight" in names or "d2t" in names:
        raise CheckpointError(f"{drafter.name} already has its own LM head: it cannot take a draft vocabulary.")
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    rows = np.ascontiguousarray(rows, dtype=np.float16)
    table = np.asarray(ids, dtype=np.int64)
    tmp = out.with_suffix(".part")
    try:
        _write(gguf, reader, arch, rows, table, tmp)
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)     # a half-written file is never taken for a finished one
        raise
    return out


def _write(gguf, reader, arch: str, rows: np.ndarray, table: np.ndarray, tmp: Path) -> None:
    writer = gguf.GGUFWriter(str(tmp), arch, endianess=reader.endianess)
    alignment = reader.fields.get(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue   # written by the writer itself
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.add_tensor_info("output.weight", rows.shape, rows.dtype, rows.nbytes, gguf.GGMLQuantizationType.F16)
    writer.add_tensor_info("d2t", table.shape, table.dtype, table.nbytes, gguf.GGMLQuantizationType.I64)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.write_tensor_data(rows)
    writer.write_tensor_data(table)
    writer.close()


def head_rows(target: Path, ids: tuple[int, ...]) -> np.ndarray:
    """Rows `ids` of the target GGUF's LM head [K, H] as float32: its `output.weight`, else the tied
    `token_embd.weight`; only those rows dequantized (gguf-py), so the drafter's head holds exactly the target's.
    A quantization gguf-py cannot read raises NotImplementedError."""
    import gguf
    from gguf.quants import dequantize
    tensors = {t.name: t for t in gguf.GGUFReader(str(target)).tensors}
    t = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if t is None:
        raise CheckpointError(f"{target.name} has neither output.weight nor token_embd.weight: no LM head to draft "
                              "with. Re-download or re-convert the model.")
    picked = np.asarray(t.data)[np.asarray(ids)]       # one row per token, whatever its block layout
    return np.asarray(dequantize(picked, t.tensor_type), dtype=np.float32)


def cached_subset(drafter: Path, target: Path, ids: tuple[int, ...]) -> Path:
    """The drafter's subset GGUF for these ids with this target's head rows, made once in the app's cache. Keyed by
    both files' identities and the ids: another target (a float32 and a 4-bit GGUF of one model have different
    rows), a changed drafter or ranking makes a new one."""
    files = "|".join(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in (drafter, target))
    key = hashlib.sha256(f"{files}|{ids}".encode()).hexdigest()[:16]
    folder = app_cache() / "gguf" / "draft-vocab"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{drafter.stem}-v{len(ids)}-{key}.gguf"
    return out if out.is_file() else subset_gguf(drafter, head_rows(target, ids), ids, out)
