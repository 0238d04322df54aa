"""Safetensors folders to GGUF with llama.cpp's own converter (from the same build): targets in the
dtype asked for, DFlash, DSpark, EAGLE-3 drafters and Gemma 4 assistants (safetensors) to GGUF drafters for their
target.

The converter runs in a child process and sees only a staging folder of links to the model's JSON
configs, tokenizer files and safetensors: no Python file and no pickle of a model folder reaches it, and
transformers is told never to run a folder's code (convert_main.py). Results are cached in the app's
cache folder under a key of what went in, so a pair converts once.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from ... import speculators
from ...config import generation_of
from ...eagle3_config import aux_inputs
from ...errors import Cancelled, CheckpointError, EngineError, PairMismatchError
from ...weights import folder_tensors
from . import build
from ...cache_dir import app_cache

# what the converter may read from a model folder
ALLOWED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
           "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
           "model.safetensors.index.json")
# the tokenizer's files among them: a Gemma 4 assistant converts with its target's (converter reads its own folder's)
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
             "tokenizer.model", "added_tokens.json")
OUTTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "q8_0": "q8_0"}
CONVERT_SECONDS = 3600.0
# Targets converted without a multi-token-prediction head (--no-mtp) when their weights hold none: llama.cpp's
# Qwen3.5/3.6 and Qwen3-Next converters fail on such a checkpoint (a model saved by transformers has none). One
# that has its head (mtp.* tensors, as Qwen ships them) keeps it: llama-server's draft-mtp speculates with it.
NO_MTP = {"Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3_5MoeForConditionalGeneration",
          "Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM"}
# A drafter takes its vocabulary from its target's converter class, run on the drafter's own: the Qwen3 MoE one
# fails there (its zero-argument super() needs its own class), and Qwen3's, the drafter's base, writes the same
# vocabulary (the tokenizer's, neither reads the weights)
DRAFT_VOCAB_AS = {"Qwen3MoeForCausalLM": "Qwen3ForCausalLM"}


def _files(folder: Path, with_weights: bool) -> list[Path]:
    names = [folder / n for n in ALLOWED if (folder / n).is_file()]
    if with_weights:
        names += sorted(folder.glob("*.safetensors"))
    return names


def identity(*folders: tuple[Path, bool]) -> str:
    """A key of the inputs: names, sizes and the JSON files' bytes (the weights by size and mtime)."""
    digest = hashlib.sha256(build.key().encode())
    for folder, weights in folders:
        for f in _files(folder, weights):
            st = f.stat()
            digest.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns if f.suffix == '.safetensors' else ''}\0".encode())
            if f.suffix == ".json":
                digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def _architectures(folder: Path) -> set[str]:
    """The config's architectures, and its text model's (a multimodal checkpoint converts as its text model)."""
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    return {*(cfg.get("architectures") or ()), *((cfg.get("text_config") or {}).get("architectures") or ())}


def _stage(folder: Path, into: Path, with_weights: bool, architectures: dict[str, str] | None = None,
           tokenizer: Path | None = None, keys: dict | None = None) -> Path:
    """Links to the files the converter may read; `architectures` renames those of the config and `keys` adds
    top-level keys to it (then a copy); `tokenizer` is a folder whose tokenizer files stand in for the folder's own."""
    into.mkdir(parents=True)
    files = _files(folder, with_weights)
    if tokenizer is not None:
        files = [f for f in files if f.name not in TOKENIZER] + [f for f in _files(tokenizer, False)
                                                                 if f.name in TOKENIZER]
    for f in files:
        os.symlink(f.resolve(), into / f.name)
    if (architectures and _architectures(folder) & set(architectures)) or keys:
        cfg = {**json.loads((folder / "config.json").read_text(encoding="utf-8")), **(keys or {})}
        for c in (cfg, cfg.get("text_config") or {}):
            if c.get("architectures"):
                c["architectures"] = [(architectures or {}).get(a, a) for a in c["architectures"]]
        (into / "config.json").unlink()
        (into / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return into


def has_mtp(folder: Path) -> bool:
    """Whether a checkpoint's weights hold a multi-token-prediction head (read from the safetensors headers)."""
    return any(name.split(".")[0] == "mtp" or ".mtp." in name for name in folder_tensors(folder))


def converter_command(frozen: bool | None = None) -> list[str]:
    """How to start convert_main: an installed (frozen) app has no `python -m`, so it runs itself with
    --convert-gguf (dflash_desktop/worker_entry.py); a source checkout runs this Python."""
    frozen = bool(getattr(sys, "frozen", False)) if frozen is None else frozen
    if frozen:
        return [sys.executable, "--convert-gguf"]
    return [sys.executable, "-m", "engine.backends.llamacpp.convert_main"]


def run_converter(args: list[str], what: str, cancelled: Callable[[], bool]) -> None:
    """convert_hf_to_gguf.py with our guard, cancellable; its log's end becomes the error message."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([*converter_command(), str(build.converter()), *args], stdout=log,
                                stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=str(build.find_build()),
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    [str(Path(__file__).resolve().parents[3]), os.environ.get("PYTHONPATH", "")])})
        end = time.monotonic() + CONVERT_SECONDS
        while proc.poll() is None:
            if cancelled() or time.monotonic() > end:
                proc.kill()
                proc.wait()
                if cancelled():
                    raise Cancelled(f"Converting {what} to GGUF was cancelled; nothing is loaded.")
                raise EngineError(f"Converting {what} to GGUF took over {CONVERT_SECONDS:.0f} s and was stopped.")
            time.sleep(0.1)
        if proc.returncode != 0:
            log.seek(0)
            text = log.read().decode(errors="replace")
            lines = [ln for ln in text.splitlines() if ln.strip()][-8:]
            hint = (" Its tokenizer's pre-tokenizer is unknown to llama.cpp's converter: this model cannot be "
                    "converted by this build; use a GGUF file made for it instead." if "pre-tokenizer was not "
                    "recognized" in text else "")
            raise CheckpointError(f"llama.cpp's converter could not convert {what} (exit code {proc.returncode})."
                                  f"{hint} Its log ends with:\n" + "\n".join(lines))


def convert(source: Path, out: Path, outtype: str, target_dir: Path | None, what: str,
            cancelled: Callable[[], bool], tokenizer: Path | None = None, keys: dict | None = None) -> Path:
    """Convert once into `out` (written under a temporary name, then renamed); target_dir: the target's config and
    tokenizer for a drafter (--target-model-dir); tokenizer: a folder whose tokenizer stands in for the source's;
    keys: config keys the converter is shown beside the source's own."""
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gguf-stage-") as tmp:
        staged = _stage(source, Path(tmp) / "model", with_weights=True, tokenizer=tokenizer, keys=keys)
        args = [str(staged), "--outfile", str(out.with_suffix(".partial")), "--outtype", outtype]
        if target_dir is not None:
            args += ["--target-model-dir", str(_stage(target_dir, Path(tmp) / "target", with_weights=False,
                                                      architectures=DRAFT_VOCAB_AS))]
        elif _architectures(source) & NO_MTP and not has_mtp(source):
            args.append("--no-mtp")
        run_converter(args, what, cancelled)
    os.replace(out.with_suffix(".partial"), out)
    return out


def target_gguf(target_dir: Path, dtype: str, cancelled=lambda: False) -> Path:
    if dtype not in OUTTYPES:
        raise EngineError(f"A target converted for llama.cpp can be {', '.join(OUTTYPES)}, not {dtype!r}.",
                          code="bad_settings")
    key = identity((target_dir, True))
    out = app_cache() / "gguf" / f"{target_dir.name}-{key}-{OUTTYPES[dtype]}.gguf"
    return convert(target_dir, out, OUTTYPES[dtype], None, f"the target in {target_dir}", cancelled)


# EAGLE-3 drafters as llama.cpp's converter knows them (SpecForge, vLLM/AngelSlim, speculators)
EAGLE3 = {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator", "Eagle3DraftModel"}
# DSpark drafters (DFlash with a Markov head) as llama.cpp's converter knows them (DeepSpec, speculators); it
# writes them as DFlash GGUFs with the head's tensors, which llama-server runs as draft-dspark
DSPARK = {"Qwen3DSparkModel", "DSparkDraftModel", "DSparkSpeculator", "Lfm2DSparkDraftModel", "LingDSparkModel",
          "Gemma4DSparkModel"}
# Gemma 4 assistants (google/gemma-4-*-it-assistant): a Gemma 4 model's multi-token-prediction drafter, a checkpoint
# of its own that reads the target's last hidden state and shares its keys and values; llama.cpp's converter writes
# it as a gemma4-assistant GGUF, which llama-server runs with -md as draft-mtp
ASSISTANT = {"Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM"}


def drafter_kind(cfg: dict) -> str | None:
    """dflash, dspark, eagle3 or mtp (a Gemma 4 assistant) for a drafter's config.json (the method it drafts
    for), else None."""
    names = set(cfg.get("architectures") or ())
    if names & DSPARK:
        return "dspark"
    if names & ASSISTANT:
        return "mtp"
    if names & {"DFlashDraftModel", "DFlash2DraftModel"}:
        return "dflash"
    if names & EAGLE3 or ("draft_vocab_size" in cfg and cfg.get("num_hidden_layers") == 1):
        return "eagle3"
    return None


def draft_gguf(draft_dir: Path, target_dir: Path, dtype: str = "float32", cancelled=lambda: False) -> Path:
    """A z-lab DFlash drafter, a DSpark, an EAGLE-3 one or a Gemma 4 assistant, for a target whose config and
    tokenizer are in target_dir; a quantized target keeps a float16 drafter (DFlash's acceptance suffers from a
    quantized drafter, and drafters are small)."""
    draft_dir = speculators.imported(draft_dir, engine="llamacpp")   # a speculators DFlash drafter converts as its z-lab import
    cfg = json.loads((draft_dir / "config.json").read_text(encoding="utf-8"))
    kind = drafter_kind(cfg)
    if kind == "dflash":
        generation_of(cfg, str(draft_dir / "config.json"))
    if kind is None:
        raise CheckpointError(f"{draft_dir} is not a DFlash, DSpark, EAGLE-3 or Gemma 4 assistant drafter "
                              f"(config.json architectures {cfg.get('architectures')}).")
    key = identity((draft_dir, True), (target_dir, False))
    outtype = OUTTYPES.get(dtype, "f16") if dtype != "q8_0" else "f16"
    # SpecForge's layer ids (nested, naming outputs): llama.cpp's converter reads only the top-level ones (inputs), and
    # would take its default layers instead
    ids = aux_inputs(cfg, str(draft_dir / "config.json")) if kind == "eagle3" else None
    keys = ({"eagle_aux_hidden_state_layer_ids": list(ids)}
            if ids and cfg.get("eagle_aux_hidden_state_layer_ids") is None else None)
    layers = f"-layers{'-'.join(map(str, ids))}" if keys else ""
    out = app_cache() / "gguf" / f"{draft_dir.name}-{kind}{layers}-{key}-{outtype}.gguf"
    what = f"the drafter in {draft_dir}"
    if kind == "mtp":
        # llama.cpp's assistant converter reads no --target-model-dir: it takes the target's tokenizer staged beside
        check_assistant(cfg, draft_dir, target_dir)
        return convert(draft_dir, out, outtype, None, what, cancelled, tokenizer=target_dir)
    return convert(draft_dir, out, outtype, target_dir, what, cancelled, keys=keys)


def check_assistant(cfg: dict, draft_dir: Path, target_dir: Path) -> None:
    """A Gemma 4 assistant folder against its target's config, before converting it: the converter would cut a
    larger vocabulary to the target's tokenizer without a word, and llama-server aborts on another hidden size."""
    try:
        target = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{target_dir / 'config.json'} cannot be read ({exc}).") from None
    text, own = target.get("text_config") or target, cfg.get("text_config") or cfg
    model_type = str(text.get("model_type") or target.get("model_type") or "")
    if not model_type.startswith("gemma4"):
        raise PairMismatchError(f"{draft_dir.name} is a Gemma 4 assistant, which drafts for a Gemma 4 model only, and "
                                f"{target_dir.name} is {model_type or 'unknown'!r}: give the model it was made for.")
    for what, mine, theirs in (("hidden size", cfg.get("backbone_hidden_size"), text.get("hidden_size")),
                               ("vocabulary", own.get("vocab_size"), text.get("vocab_size"))):
        if mine is not None and theirs is not None and int(mine) != int(theirs):
            raise PairMismatchError(f"{draft_dir.name} is a Gemma 4 assistant for a model of {what} {mine}, but "
                                    f"{target_dir.name} has {what} {theirs}: this assistant was made for another "
                                    "model.")
