"""Reads a GGUF file's header (its key/value metadata) without loading any tensor, so a wrong or damaged
file and a drafter made for another target are refused with a clear message before llama-server starts.
Pure standard library: the window may call it too."""
from __future__ import annotations

import struct
from pathlib import Path

from .errors import CheckpointError, PairMismatchError

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_STRING = 1 << 24     # far above any real key or token, far below a damaged length field
MAX_KEYS = 1 << 16
KEEP_ARRAY = 4096        # longer arrays (the vocabulary) are skipped, their length kept


class _Reader:
    def __init__(self, f, where: str):
        self.f, self.where = f, where

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise CheckpointError(f"{self.where} ends inside its header: the file is truncated. Download it again.")
        return struct.unpack(fmt, data)[0]

    def string(self) -> str:
        n = self.take("<Q")
        if n > MAX_STRING:
            raise CheckpointError(f"{self.where} has a damaged header (a {n}-byte string). Download it again.")
        data = self.f.read(n)
        if len(data) != n:
            raise CheckpointError(f"{self.where} ends inside its header: the file is truncated. Download it again.")
        return data.decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.take("<I"), self.take("<Q")
            if item == _ARRAY or n > 1 << 32:
                raise CheckpointError(f"{self.where} has a damaged header (array of {n}). Download it again.")
            if item in _SCALARS and n > KEEP_ARRAY:
                self.f.seek(n * struct.calcsize(_SCALARS[item]), 1)
                return ArrayLength(n)
            values = [self.value(item) for _ in range(n)]
            return values if n <= KEEP_ARRAY else ArrayLength(n)
        raise CheckpointError(f"{self.where} has a damaged header (value type {kind}). Download it again.")


class ArrayLength(int):
    """A long array (a vocabulary) read as its length only."""


def read_metadata(path: Path, tensors: bool = False) -> dict:
    """The file's metadata, plus 'gguf.tensor_count' and, with tensors, 'gguf.tensors': the tensors' names
    (what tells a DSpark drafter from a DFlash one: drafter_method). Raises CheckpointError naming the
    problem."""
    path = Path(path)
    where = f"The GGUF file {path}"
    if not path.is_file():
        raise CheckpointError(f"{where} does not exist. Check the path or download the model again.")
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise CheckpointError(f"{path} is not a GGUF file (it does not start with 'GGUF'). Give a .gguf "
                                  "model file, or a folder of safetensors to convert.")
        r = _Reader(f, where)
        version, tensors_n, keys = r.take("<I"), r.take("<Q"), r.take("<Q")
        if version not in (2, 3) or keys > MAX_KEYS:
            raise CheckpointError(f"{where} has GGUF version {version} and {keys} keys: damaged or from an "
                                  "unknown llama.cpp version. Download or convert it again.")
        meta = {"gguf.version": version, "gguf.tensor_count": tensors_n}
        for _ in range(keys):
            name = r.string()
            meta[name] = r.value(r.take("<I"))
        if tensors:
            meta["gguf.tensors"] = frozenset(_tensor_names(r, tensors_n))
    return meta


def _tensor_names(r: _Reader, n: int):
    """The tensor entries after the keys: a name, its dimensions, type and offset (only the name kept)."""
    for _ in range(n):
        name, dims = r.string(), r.take("<I")
        if dims > 4:                           # ggml's most
            raise CheckpointError(f"{r.where} has a damaged header (a tensor of {dims} dimensions). Download "
                                  "it again.")
        r.f.seek(8 * dims + 4 + 8, 1)
        yield name


# GGUF drafter architectures -> the speculation method each drafts for (engine.backends.METHODS); a Gemma 4
# assistant is a Gemma 4 model's multi-token-prediction drafter, a checkpoint of its own (llama.cpp's draft-mtp)
DRAFTER_METHODS = {"dflash": "dflash", "eagle3": "eagle3", "gemma4-assistant": "mtp"}


def architecture(meta: dict) -> str:
    return str(meta.get("general.architecture", ""))


def drafter_method(meta: dict) -> str:
    """The method a drafter GGUF drafts for, told apart as llama-server tells them (its speculative.cpp): a
    dflash one with a Markov head (tensor markov_w1) is DSpark, one with DFlash2's candidate selector
    (selector_hidden) DFlash2; needs read_metadata(..., tensors=True)."""
    arch = architecture(meta)
    if arch == "dflash" and "markov_w1.weight" in meta["gguf.tensors"]:
        return "dspark"
    if arch == "dflash" and "selector_hidden.weight" in meta["gguf.tensors"]:
        return "dflash2"
    return DRAFTER_METHODS.get(arch, arch)


def vocab_size(meta: dict) -> int:
    tokens = meta.get("tokenizer.ggml.tokens")
    return len(tokens) if isinstance(tokens, list) else int(tokens or 0)


def check_pair(target: dict, draft: dict, target_name: str, draft_name: str) -> None:
    """A DFlash, DSpark, EAGLE-3 or Gemma 4 assistant drafter GGUF against its target's: what llama.cpp would
    otherwise abort on, or silently run slowly with (a drafter for another model accepts nothing)."""
    arch = architecture(target)
    if arch in DRAFTER_METHODS:
        raise PairMismatchError(f"{target_name} is a drafter ({arch}), not a target model. Swap the two files.")
    if architecture(draft) == "eagle3":
        return _check_eagle3(target, draft, target_name, draft_name)
    if architecture(draft) == "gemma4-assistant":
        return _check_assistant(target, draft, target_name, draft_name)
    if architecture(draft) != "dflash":
        raise PairMismatchError(f"{draft_name} is not a DFlash or EAGLE-3 drafter, nor a DSpark one or a Gemma 4 "
                                f"assistant (its architecture is {architecture(draft) or 'unknown'!r}). Give a drafter "
                                "converted for llama.cpp.")
    layers = target.get(f"{arch}.block_count")
    wanted = [int(i) for i in draft.get("dflash.target_layers") or []]
    # the drafter stores layer-output indices counted from the embeddings (layer i -> i + 1)
    if not wanted or not layers or max(wanted) > int(layers) - 1 or min(wanted) < 1:
        raise PairMismatchError(
            f"{draft_name} reads target layers {[i - 1 for i in wanted]} but {target_name} has {layers} layers, "
            "and llama.cpp cannot export its last one: this drafter was not made for this target.")
    _same_sizes(target, draft, target_name, draft_name, "dflash.embedding_length")
    if any(f"dflash.{key}" in draft for key in DFLASH2_SETTINGS):
        _check_dflash2(draft, draft_name)


# DFlash2's convolution and selector settings in a GGUF (llama.cpp's converter writes all four)
DFLASH2_SETTINGS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def _check_dflash2(draft: dict, draft_name: str) -> None:
    """What llama.cpp's DFlash2 graph needs of a drafter (its src/models/dflash.cpp refuses the file otherwise,
    and the server would only say it could not load a model)."""
    hidden = int(draft.get("dflash.embedding_length") or 0)
    settings = {key: int(draft.get(f"dflash.{key}") or 0) for key in DFLASH2_SETTINGS}
    missing = [f"dflash.{key}" for key, value in settings.items() if value <= 0]
    if missing:
        raise CheckpointError(f"{draft_name} is a DFlash2 drafter without {', '.join(missing)}: the file is "
                              "incomplete. Convert the drafter again from its folder, or download it again.")
    group, top_k = settings["conv_group_size"], settings["selector_top_k"]
    if hidden % group or hidden < top_k * (top_k + 1):
        raise CheckpointError(
            f"{draft_name} is a DFlash2 drafter that llama.cpp cannot run: its hidden size {hidden} must be a "
            f"multiple of its convolution group ({group}) and at least top-k x (top-k + 1) = {top_k * (top_k + 1)} "
            "(its selector's lattice is packed into one hidden row). Run it in the torch engine instead.")


def _check_eagle3(target: dict, draft: dict, target_name: str, draft_name: str) -> None:
    """An EAGLE-3 drafter reads three of its target's layers and its hidden size, over its vocabulary."""
    arch = architecture(target)
    layers = int(target.get(f"{arch}.block_count") or 0)
    wanted = [int(i) for i in draft.get("eagle3.target_layers") or []]
    if len(wanted) != 3 or not layers or max(wanted) > layers or min(wanted) < 0:
        raise PairMismatchError(f"{draft_name} reads target layers {wanted} but {target_name} has {layers} layers: "
                                "this EAGLE-3 drafter was not made for this target.")
    _same_sizes(target, draft, target_name, draft_name, "eagle3.target_hidden_size")


def _check_assistant(target: dict, draft: dict, target_name: str, draft_name: str) -> None:
    """A Gemma 4 assistant reads its Gemma 4 target's hidden state (embedding_length_out: llama-server aborts on
    another width) and the keys and values of its last sliding and last full attention layer (llama.cpp shares
    them, so each of the assistant's layers must read as wide a cache), over its vocabulary."""
    arch = architecture(target)
    if arch != "gemma4":
        raise PairMismatchError(f"{draft_name} is a Gemma 4 assistant, which drafts for a Gemma 4 model only, and "
                                f"{target_name} is {arch or 'unknown'!r}: give the model it was made for.")
    _same_sizes(target, draft, target_name, draft_name, "gemma4-assistant.embedding_length_out")
    layers = int(target.get("gemma4.block_count") or 0)
    for i in range(int(draft.get("gemma4-assistant.block_count") or 0)):
        sliding = _is_sliding(draft, "gemma4-assistant", i)
        want, got = _kv_heads(target, arch, layers - (2 if sliding else 1)), _kv_heads(draft, "gemma4-assistant", i)
        if all(want + got) and want != got:
            kind = "sliding" if sliding else "full"
            raise PairMismatchError(f"{draft_name} reads keys of {got[0]} heads of {got[1]} in its {kind} attention "
                                    f"layers but {target_name}'s last {kind} attention layer stores {want[0]} heads of "
                                    f"{want[1]}: this assistant was made for another model.")


def kv_width(meta: dict) -> int:
    """Numbers one token's keys (or values) take in one layer's cache, as the header gives them (the widest
    layer where they differ)."""
    arch = architecture(meta)
    heads = meta.get(f"{arch}.attention.head_count_kv") or meta.get(f"{arch}.attention.head_count") or 0
    heads = max(heads) if isinstance(heads, list) else int(heads)
    size = meta.get(f"{arch}.attention.key_length") or (
        int(meta.get(f"{arch}.embedding_length") or 0) // max(int(meta.get(f"{arch}.attention.head_count") or 1), 1))
    return int(heads) * int(size)


def _is_sliding(meta: dict, arch: str, layer: int) -> bool:
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    return bool(pattern[layer]) if isinstance(pattern, list) and 0 <= layer < len(pattern) else False


def _kv_heads(meta: dict, arch: str, layer: int) -> tuple[int, int]:
    """A layer's key-value heads and their size, as its cache holds them (0: not in the header)."""
    heads = meta.get(f"{arch}.attention.head_count_kv")
    if isinstance(heads, list):
        heads = heads[layer] if 0 <= layer < len(heads) else 0
    sliding = _is_sliding(meta, arch, layer)
    size = meta.get(f"{arch}.attention.key_length_swa" if sliding else f"{arch}.attention.key_length")
    return int(heads or 0), int(size or 0)


def _same_sizes(target: dict, draft: dict, target_name: str, draft_name: str, hidden_key: str) -> None:
    """The drafter's idea of its target's hidden size (under hidden_key) and vocabulary, against the target's."""
    arch = architecture(target)
    for what, t_key, d_key in (("hidden size", f"{arch}.embedding_length", hidden_key),
                               ("vocabulary", "tokenizer.ggml.tokens", "tokenizer.ggml.tokens")):
        t, d = target.get(t_key), draft.get(d_key)
        if t is not None and d is not None and _size(t) != _size(d):
            raise PairMismatchError(f"{draft_name} has {what} {_size(d)} but {target_name} has {_size(t)}: "
                                    "this drafter was made for another model.")


def _size(v) -> int:
    return len(v) if isinstance(v, list) else int(v)
