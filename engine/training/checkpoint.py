"""Training files that load without unpickling: the app never unpickles, not even its own files.

A file is one safetensors file: named tensors (weights, optimizer moments, token ids) and, in its
header, a JSON document for everything else (training state, optimizer settings). Reading it runs
no code. Saves go to a temporary file that replaces the old one only when complete, so an
interrupted save leaves the previous file whole.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..errors import EngineError

MODEL, OPTIMIZER = "model.", "optimizer."


class TrainingFileError(EngineError):
    code = "bad_training_input"


def save_checkpoint(path: Path, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Write `tensors` and the JSON `meta` to `path` atomically (temporary file, then os.replace)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        save_file(_storable(tensors), tmp, metadata={"meta": json.dumps(meta)})
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path, tensors: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, meta) of a file written by save_checkpoint; tensors=False reads only its header's meta."""
    try:
        with safe_open(str(path), "pt") as f:
            meta = json.loads((f.metadata() or {})["meta"])
            return {name: f.get_tensor(name) for name in f.keys()} if tensors else {}, meta
    except (SafetensorError, OSError, KeyError, ValueError) as exc:
        raise TrainingFileError(f"{path} is damaged or was not written by this version ({exc!r}). "
                                "Delete it and run again.") from exc


def _storable(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, tied ones copied: safetensors refuses tensors that share memory."""
    out, seen = {}, set()
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        storage = t.untyped_storage().data_ptr()
        out[name] = t.clone() if storage in seen else t
        seen.add(storage)
    return out


# ---- a model with its optimizer ------------------------------------------------------------------

def training_checkpoint(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(tensors, meta) of a model and its optimizer: weights under "model.", each parameter's
    optimizer tensors as "optimizer.<param>.<key>", the optimizer's other values (param_groups,
    any plain per-parameter values) in meta["optimizer"]."""
    tensors = {MODEL + name: t for name, t in model.state_dict().items()}
    saved = opt.state_dict()
    plain: dict[str, dict] = {}
    for param, values in saved["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{OPTIMIZER}{param}.{key}"] = value
            else:
                plain.setdefault(str(param), {})[key] = value
    return tensors, {"optimizer": {"param_groups": saved["param_groups"], "state": plain}}


def restore_training(tensors: dict, meta: dict, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """Load what training_checkpoint saved into `model` and `opt`."""
    model.load_state_dict({name[len(MODEL):]: t for name, t in tensors.items() if name.startswith(MODEL)})
    state: dict[int, dict] = {}
    for name, t in tensors.items():
        if name.startswith(OPTIMIZER):
            param, key = name[len(OPTIMIZER):].split(".", 1)
            state.setdefault(int(param), {})[key] = t
    for param, values in meta["optimizer"]["state"].items():
        state.setdefault(int(param), {}).update(values)
    opt.load_state_dict({"state": state, "param_groups": meta["optimizer"]["param_groups"]})


# ---- regenerated sequences -----------------------------------------------------------------------

def save_sequences(path: Path, seqs: list[tuple[int, list[int]]], made_from: str | None = None,
                   answers_of: str | None = None) -> None:
    """(prompt length, token ids) pairs as three int64 tensors: prompt lengths, lengths, all ids; made_from
    names what they were made from (DraftTrainer.data_key), so a work folder is reused only for the same data;
    answers_of names the target and settings that answered (DraftTrainer.answers_key), so answers to the same
    prompts are reused by a run on other data."""
    meta = {key: value for key, value in (("made_from", made_from), ("answers_of", answers_of)) if value}
    save_checkpoint(path, {
        "prompt_lengths": torch.tensor([p for p, _ in seqs], dtype=torch.int64),
        "lengths": torch.tensor([len(toks) for _, toks in seqs], dtype=torch.int64),
        "tokens": torch.tensor([t for _, toks in seqs for t in toks], dtype=torch.int64),
    }, meta)


def load_sequences(path: Path) -> list[tuple[int, list[int]]]:
    tensors, _ = load_checkpoint(path)
    try:
        rows = tensors["tokens"].split(tensors["lengths"].tolist())
        return [(p, row.tolist()) for p, row in zip(tensors["prompt_lengths"].tolist(), rows, strict=True)]
    except (KeyError, RuntimeError, ValueError) as exc:
        raise TrainingFileError(f"{path} does not hold regenerated sequences ({exc!r}). "
                                "Delete it and run again to regenerate them.") from exc


# ---- files of older versions ---------------------------------------------------------------------

def report_old_pickles(folder: Path, names: Iterable[str], log: Callable[[str], None]) -> None:
    """Older versions saved these files with torch.save; reading them would unpickle, so they are
    left alone and the user is told why the run starts without them."""
    for name in names:
        if (Path(folder) / name).exists():
            log(f"found {name} in {folder} from an older version: it is not loaded, because reading it "
                "would need unpickling. This run starts without it; delete it to stop this message.")
