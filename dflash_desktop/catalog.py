"""The curated catalog of DFlash pairs (target model + drafter trained for it).

The bundled ``assets/catalog.json`` always works offline. ``refresh_catalog(url)`` fetches a newer copy
and keeps it in the app cache only if it validates; any failure leaves the bundled (or last good)
copy in use, so a bad network or a bad file can never leave the app without a catalog.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import assets
from engine.backends import DEVICE_CLASSES, ENGINES

from . import paths

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
DEFAULT_CATALOG_URL = "https://raw.githubusercontent.com/dflash-desktop/catalog/main/catalog.json"
KINDS = ("hub", "embedded")
_TARGET_INTS = ("layers", "attention_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                "head_dim", "vocab_size", "max_context")
_DRAFTER_INTS = ("layers", "num_kv_heads", "head_dim", "block_size", "captured_layers")


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
class Pair:
    id: str
    name: str
    kind: str
    target: ModelSpec
    drafter: ModelSpec
    engines: dict[str, tuple[str, ...]]   # engine -> device classes it runs this pair on (best engine first)
    notes: str
    approximate: tuple[str, ...]
    raw: dict = field(repr=False, compare=False)

    @property
    def needs_download(self) -> bool:
        return self.kind == "hub"

    @property
    def block_size(self) -> int:
        return int(self.drafter["block_size"])

    @property
    def chat_mode(self) -> str:
        return str(self.drafter.get("chat_mode", "unknown"))

    @property
    def thinking(self) -> bool | None:
        """Whether the drafter was trained with the chat template's thinking on (None: no such switch)."""
        return self.drafter.get("thinking")

    @property
    def model_type(self) -> str:
        return str(self.target["model_type"])

    @property
    def device_classes(self) -> set[str]:
        return {d for devices in self.engines.values() for d in devices}

    def repos(self) -> list[tuple[str, str]]:
        """(repo_id, revision) of target then drafter, for the downloader."""
        return [(m.repo_id, m.revision) for m in (self.target, self.drafter) if m.repo_id]

    def local_path(self, role: str) -> Path | None:
        """Absolute folder of an embedded model (None for hub models)."""
        spec = self.target if role == "target" else self.drafter
        # embedded paths are relative to the folder that holds assets/ ("assets/demo/target")
        return assets.path().parent / spec.path if spec.path else None


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
    def demo(self) -> Pair:
        return next(p for p in self.pairs if p.kind == "embedded")


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
    else:
        _need(isinstance(d.get("path"), str) and d["path"], where, "embedded models need a 'path'")
    _pos_int(d, "params", where)
    for key in (_TARGET_INTS if role == "target" else _DRAFTER_INTS):
        _pos_int(d, key, where)
    if role == "target":
        _need(isinstance(d.get("model_type"), str) and d["model_type"], where,
              "'model_type' must name the architecture, as the model's config.json does")
        _need(d["attention_layers"] <= d["layers"], where, "'attention_layers' cannot exceed 'layers'")
        _need(d.get("native_dtype") in dtypes, where, f"unknown 'native_dtype' {d.get('native_dtype')!r}")
        _need(isinstance(d.get("recurrent_state_bytes", 0), int), where, "'recurrent_state_bytes' must be an int")
    else:
        _need(d.get("dtype") in dtypes, where, f"unknown 'dtype' {d.get('dtype')!r}")
        _need(d.get("thinking") in (True, False, None), where, "'thinking' must be true, false or null")
    return ModelSpec(role=role, repo_id=d.get("repo_id"), revision=str(d.get("revision") or "main"),
                     path=d.get("path"), params=int(d["params"]), raw=d)


def _engines(raw: Any, model_type: str, where: str) -> dict[str, tuple[str, ...]]:
    """The pair's engines this app has, each with the device classes it lists. An engine a newer catalog
    names and this version lacks is skipped; a listing the engine does not run is an error, so the
    catalog can never promise what the code cannot do."""
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
        engines = _engines(p.get("engines"), target["model_type"], pw)
        if not engines:
            log.info("%s: no engine of this app version runs it; skipped", pw)
            continue
        pairs.append(Pair(id=pid, name=str(p.get("name") or pid), kind=kind, target=target,
                          drafter=_spec(p.get("drafter"), "drafter", kind, pw, dtypes),
                          engines=engines, notes=str(p.get("notes", "")),
                          approximate=tuple(p.get("approximate", ())), raw=p))
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
    """A refreshed catalog must not drop the embedded demo pair: it is what works offline."""
    if any(p.kind == "embedded" for p in cat.pairs):
        return cat
    return Catalog(pairs=(bundled.demo, *cat.pairs), dtype_bytes={**bundled.dtype_bytes, **cat.dtype_bytes},
                   source=cat.source, updated=cat.updated)


def load_catalog(prefer_refreshed: bool = True) -> Catalog:
    """The refreshed copy when one validates, else the bundled one (which must always load)."""
    bundled = load_file(bundled_path(), "bundled")
    if prefer_refreshed and refreshed_path().exists():
        try:
            return _with_demo(load_file(refreshed_path()), bundled)
        except CatalogError as exc:
            log.warning("Ignoring the refreshed catalog: %s", exc)
    return bundled


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
