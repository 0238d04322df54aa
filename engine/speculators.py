"""DFlash and DSpark drafters saved by vLLM's speculators library (RedHatAI's `*-speculator.dflash` and
`*.dspark*` repositories), imported into z-lab's (DeepSpec's, for DSpark) format once so that every engine and
conversion reads one format.

The two formats hold the same drafter: the same layer names and shapes, the same attention rule. They differ in
their config.json (speculators nests the layer settings in `transformer_layer_config`, numbers the target layers
it reads as Hugging Face's hidden_states list does, one past z-lab's, and says in `sliding_window_non_causal`
whether the sliding layers see the whole block) and in what they save beside the layers: a copy of the target's
embedding and of the target's LM head rows the drafter was trained to propose, with `d2t`, the map from those
rows to target token ids. The engines take embedding and head from the target itself, so the import keeps the
layers and turns `d2t` into the drafter's draft vocabulary (engine/draft_vocab.py): it drafts from the tokens it
was trained on. A DSpark drafter's Markov head scores the same subset (markov_w2 has a row per kept token): the
import spreads those rows over the whole vocabulary, zeros elsewhere, as llama.cpp scatters them at run time
(llama.cpp's own converter reads the speculators folder as it is). Pure standard library; the weights are copied
byte for byte, nothing from the folder runs."""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from . import weights
from .cache_dir import app_cache
from .draft_vocab import DraftVocab
from .dspark_config import DSparkConfig
from .errors import CheckpointError

# saved beside the layers; the engines read the target's own embedding and head instead
NOT_LAYERS = ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d", "verifier_lm_head.weight",
              "verifier_norm.weight")
# transformer_layer_config keys that describe the library's class, not the drafter
_DROPPED = ("architectures", "auto_map", "_attn_implementation", "is_causal", "dflash_config", "block_size")
# speculators_model_type values of DFlash drafters: imported (dflash, dspark) or refused by name (dflash2); other
# kinds (EAGLE-3) go to llama.cpp's converter as they are
KINDS = ("dflash", "dflash2", "dspark")
MARKOV_W2 = "markov_head.markov_w2.weight"     # DSpark's bias per drafted token
# transformers' Qwen3Config defaults, which speculators' loader falls back on for keys its config file omits (it
# saves the layer settings as a diff against the class defaults)
QWEN3_DEFAULTS = {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "rms_norm_eps": 1e-6,
                  "max_position_embeddings": 32768, "hidden_act": "silu"}
# bumped when an import would be written differently, so that older imports are made again
FORMAT = 2
STALE_S = 86400         # a temporary folder this old was left by an import that never finished
CORPUS = "the tokens the drafter was trained to propose (speculators d2t)"


def kind(raw: dict[str, Any]) -> str | None:
    """`dflash`, `dflash2` or `dspark` for a speculators drafter's config.json, None for any other."""
    value = raw.get("speculators_model_type")
    if value is None and raw.get("architectures") == ["DSparkSpeculator"]:
        return "dspark"
    return value if isinstance(value, str) else None


def translated(raw: dict[str, Any], source: str = "config.json") -> dict[str, Any]:
    """The z-lab config.json of a speculators DFlash drafter, or CheckpointError saying why it cannot be one."""
    name = kind(raw)
    if name == "dflash2":
        raise CheckpointError(
            f"This DFlash2 drafter was saved by vLLM's speculators library ({source}), whose DFlash2 format DFlash "
            "Desktop does not read yet. Pick the model's DFlash drafter (speculators or z-lab) or z-lab's DFlash2 "
            "drafter.", code="unsupported_architecture")
    if name not in ("dflash", "dspark"):
        raise CheckpointError(f"{source}: speculators_model_type {name!r} is not a DFlash drafter. Pick a DFlash "
                              "drafter for this model.", code="unsupported_architecture")
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise CheckpointError(f"{source} has no transformer_layer_config, so the drafter's layers cannot be built. "
                              "Re-download the drafter.")
    if name == "dflash" and raw.get("sample_from_anchor"):
        raise CheckpointError(
            f"{source}: this drafter predicts from its anchor slot (sample_from_anchor), a DSpark-style variant "
            "whose drafts DFlash Desktop's engines do not compute. Pick the model's DFlash drafter instead.",
            code="unsupported_architecture")
    missing = [k for k in ("block_size", "mask_token_id", "aux_hidden_state_layer_ids") if raw.get(k) is None]
    if missing:
        raise CheckpointError(f"{source} is a speculators DFlash drafter without {', '.join(missing)}. The "
                              "checkpoint is incomplete: re-download the drafter.")
    aux = raw["aux_hidden_state_layer_ids"]
    if not (isinstance(aux, list) and aux and all(isinstance(i, int) and not isinstance(i, bool) and 0 < i < 1025
                                                  for i in aux)):
        raise CheckpointError(f"{source}: aux_hidden_state_layer_ids must list target layers counted from 1 (0 is "
                              f"the embedding, which DFlash does not read), got {aux!r}. Re-download the drafter.")
    out = {k: v for k, v in layer.items() if k not in _DROPPED}
    if layer.get("model_type", "qwen3") == "qwen3":
        out = {**QWEN3_DEFAULTS, **out}
        if not out.get("use_sliding_window"):
            # Qwen3Config drops the window unless use_sliding_window is set, and speculators then runs its
            # "sliding" layers as full ones that see the whole block
            out["sliding_window"] = None
            if isinstance(out.get("layer_types"), list):
                out["layer_types"] = ["full_attention"] * len(out["layer_types"])
    hidden, target_hidden = out.get("hidden_size"), raw.get("target_hidden_size")
    if target_hidden is not None and target_hidden != hidden:
        raise CheckpointError(f"{source}: the drafter's width ({hidden}) differs from its target's "
                              f"(target_hidden_size {target_hidden}), which DFlash Desktop's engines do not run. "
                              "Pick a drafter of the target's width.", code="unsupported_architecture")
    out.update(architectures=["DFlashDraftModel"], block_size=raw["block_size"],
               dflash_config={"mask_token_id": raw["mask_token_id"], "target_layer_ids": [i - 1 for i in aux]})
    if name == "dspark":     # speculators' layout drafts after the last token unless it says otherwise
        out.update(architectures=["DSparkDraftModel"], sample_from_anchor=raw.get("sample_from_anchor", False),
                   markov_head_type=raw.get("markov_head_type", "vanilla"), markov_rank=raw.get("markov_rank"))
        DSparkConfig.from_dict(out, out.get("vocab_size"), source)   # a head no engine of ours computes: refused
    if raw.get("sliding_window_non_causal"):
        out["is_causal"] = False    # every layer sees the whole block; by default the sliding layers are causal
    return out


def imported(draft_dir: Path, progress: Callable[[str, str], None] | None = None, engine: str | None = None) -> Path:
    """The drafter folder the engine reads: the folder itself unless it is a speculators one, then its z-lab
    import in the app's cache, made once (checked, written beside its final place and renamed when complete).
    llama.cpp's converter reads a speculators DSpark drafter as it is, reduced vocabulary (d2t) included."""
    draft_dir = Path(draft_dir)
    config = draft_dir / "config.json"
    try:
        text = config.read_bytes()
        raw = json.loads(text)
    except (OSError, ValueError):
        return draft_dir        # the engine's own reader says what is wrong with it
    if not isinstance(raw, dict) or kind(raw) not in KINDS or (engine == "llamacpp" and kind(raw) == "dspark"):
        return draft_dir
    translated_config = translated(raw, str(config))       # refused before anything is written
    files = sorted(draft_dir.glob("*.safetensors"))
    key = hashlib.sha256(f"{FORMAT}\0".encode() + text + "".join(
        f"\0{f.name}\0{st.st_size}\0{st.st_mtime_ns}" for f in files for st in [f.stat()]).encode()).hexdigest()[:12]
    # named for the folder it came from (its path hashed: two drafters may share a folder name) and its contents
    origin = f"{draft_dir.name}-{hashlib.sha256(str(draft_dir.resolve()).encode()).hexdigest()[:8]}"
    dest = app_cache() / "drafters" / f"{origin}-{key}"
    if (dest / "config.json").is_file():          # written last: a folder holding it is complete
        return dest
    if progress is not None:
        progress("convert", f"Importing {draft_dir.name} (a speculators drafter, once)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{origin}-", dir=dest.parent))
    try:
        _write(draft_dir, files, translated_config, tmp)
        if not (dest / "config.json").is_file():  # another load may have imported it meanwhile: keep that one
            shutil.rmtree(dest, ignore_errors=True)
            try:
                tmp.rename(dest)
            except OSError as exc:
                if not (dest / "config.json").is_file():
                    raise CheckpointError(f"The import of {draft_dir.name} could not be put in place in "
                                          f"{dest.parent} ({exc}). Check the disk and load the drafter again.") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _forget_others(dest, origin)
    return dest


def _forget_others(kept: Path, origin: str) -> None:
    """Remove older imports of the same folder (each as large as the drafter) and temporary folders that
    an interrupted import left a day ago or more."""
    for path in kept.parent.iterdir():
        old_import = path.name.startswith(f"{origin}-") and path != kept
        abandoned = path.name.startswith(".") and time.time() - path.stat().st_mtime > STALE_S
        if path.is_dir() and (old_import or abandoned):
            shutil.rmtree(path, ignore_errors=True)


def _write(draft_dir: Path, files: list[Path], config: dict, out: Path) -> None:
    source = str(draft_dir / "config.json")
    tensors = {}
    for path in files:
        tensors.update({name: (path, t) for name, t in weights.read_header(path).items()})
    if not tensors:
        raise CheckpointError(f"{draft_dir} holds no *.safetensors weights. Re-download the drafter.")
    vocab_size = config.get("vocab_size")
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
        raise CheckpointError(f"{source}: transformer_layer_config.vocab_size must be the target's vocabulary size, "
                              f"got {vocab_size!r}. Re-download the drafter.")
    embed = tensors.get("embed_tokens.weight")     # the target's embedding, copied: its shape checks the config
    if embed is not None and list(embed[1].shape) != [vocab_size, config.get("hidden_size")]:
        raise CheckpointError(f"{source} describes a drafter of width {config.get('hidden_size')} over {vocab_size} "
                              f"tokens, but its embed_tokens.weight is {list(embed[1].shape)}: the files disagree. "
                              "Re-download the drafter.")
    ids = None
    if "d2t" in tensors:
        offsets = weights.read_ints(tensors["d2t"][0], "d2t", most=vocab_size)
        ids = [i + d for i, d in enumerate(offsets)]
        if not all(0 <= t < vocab_size for t in ids) or len(set(ids)) != len(ids):
            raise CheckpointError(f"{tensors['d2t'][0]}: d2t maps the drafter's tokens outside the target's "
                                  f"vocabulary of {vocab_size} or twice onto one token. Re-download the drafter.")
    spread = MARKOV_W2 if MARKOV_W2 in tensors and ids is not None and len(ids) < vocab_size else None
    layers = sorted(n for n in tensors if n not in NOT_LAYERS and n != spread)
    weights.copy_tensors(draft_dir, layers, out / "model.safetensors")
    if spread:
        weights.spread_rows(tensors[spread][0], spread, ids, vocab_size, out / "markov.safetensors")
    if ids is not None and len(ids) < vocab_size:
        DraftVocab(tuple(ids), vocab_size, CORPUS, trained=True).save(out, 0)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")   # last: complete
