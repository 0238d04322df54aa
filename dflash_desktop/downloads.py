"""Robust model downloads from the Hugging Face hub, in a background thread.

huggingface_hub (2.4.0) resolves revisions, lists files (with their LFS sha256) and owns the cache
layout, token storage and error types; the byte transfer is ours because the library cannot be
cancelled mid-file and deletes its partial file on failure (its temporary name is unique per call),
so a cancelled or crashed download would restart from zero. Here each file streams into
``blobs/<etag>.incomplete`` in the shared cache, resumes with an HTTP Range request, is hashed
(sha256 for LFS files, git blob sha1 otherwise) and only then moved into place and linked from
``snapshots/<commit>/``: the same layout huggingface_hub and transformers read, so models already in
the cache are reused and ours are usable by other tools.

Nothing the hub or the catalog sends becomes a path unchecked: repo ids, revisions, commit shas, oids
and listed file paths are validated where they enter (``_check_request``, ``_checked_listing``), and
every write, append, delete and link first checks that no symlink leads out of the repo's folder
(``_inside``).

Mirror: pass ``endpoint=`` or set HF_ENDPOINT. Proxy: httpx reads HTTPS_PROXY / HTTP_PROXY / NO_PROXY.
Offline: ``offline=True`` or HF_HUB_OFFLINE=1 makes no network call at all.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path, PureWindowsPath
from typing import Callable, Iterable

os.environ.setdefault("HF_HUB_DISABLE_XET", "1")  # plain HTTP only: Xet transfers cannot be resumed by us

import httpx2  # noqa: E402  (huggingface_hub's HTTP client)
from huggingface_hub import HfApi, hf_hub_url  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError, GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError)
from huggingface_hub.hf_api import RepoFile  # noqa: E402
from huggingface_hub.utils import (  # noqa: E402
    build_hf_headers, get_session, get_token, hf_raise_for_status, validate_repo_id)

from . import paths  # noqa: E402

log = logging.getLogger(__name__)

ALLOW_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.json", "tokenizer*", "*.tiktoken",
                  "merges.txt", "vocab.txt", "*.jinja", "chat_template*")
# Weights saved with Python's pickle (torch.save): a repository with only these has nothing we may load.
PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt")
# Pickle-based or unused formats: never fetched even when an allow pattern matches.
IGNORE_PATTERNS = (*PICKLED_WEIGHTS, "*.h5", "*.msgpack", "*.onnx", "*.gguf", "*.py", "original/*", "metal/*")
# A catalog variant (catalog.py) names its files exactly: GGUF files are fetched then, pickles never.
FILES_IGNORE = tuple(p for p in IGNORE_PATTERNS if p != "*.gguf")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
CHUNK = 64 * 1024
DISK_RESERVE = 200 * 2**20  # keep some room for the OS and logs

STATES = ("idle", "resolving", "checking", "downloading", "verifying", "done", "failed", "cancelled")


class DownloadError(Exception):
    """A download problem the user can act on. ``kind`` lets the UI pick an action button."""

    def __init__(self, kind: str, message: str, repo_id: str | None = None):
        super().__init__(message)
        self.kind, self.message, self.repo_id = kind, message, repo_id


class Cancelled(Exception):
    pass


class UnsafeName(ValueError):
    """A name from the hub or the catalog that could lead a path out of the model's folder."""


class _Transient(Exception):
    """A dropped connection or a 5xx/429: retry with Range."""


@dataclass(frozen=True)
class Progress:
    state: str
    bytes_done: int
    bytes_total: int
    bytes_received: int  # over the network during this run (resumed bytes excluded)
    speed_bps: float
    eta_s: float | None
    files_done: int
    files_total: int
    current_repo: str | None = None
    current_file: str | None = None
    retries: int = 0

    @property
    def fraction(self) -> float:
        return self.bytes_done / self.bytes_total if self.bytes_total else 1.0


@dataclass
class _File:
    repo_id: str
    commit: str
    path: str
    size: int
    etag: str  # lfs sha256 or git blob sha1: the blob name in the cache
    sha256: str | None
    storage: Path

    @property
    def blob(self) -> Path:
        return self.storage / "blobs" / self.etag

    @property
    def partial(self) -> Path:
        return self.storage / "blobs" / f"{self.etag}.incomplete"

    @property
    def pointer(self) -> Path:
        return self.storage / "snapshots" / self.commit / self.path


def wanted(path: str, allow: Iterable[str] = ALLOW_PATTERNS, ignore: Iterable[str] = IGNORE_PATTERNS) -> bool:
    """Whether a repo file is fetched: matches an allow pattern and no ignore pattern."""
    name = path.rsplit("/", 1)[-1]
    match = lambda pats: any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(name, p) for p in pats)  # noqa: E731
    return match(allow) and not (match(ignore) or any(path.startswith(p[:-1]) for p in ignore if p.endswith("/*")))


def pickled_only(paths: list[str]) -> str | None:
    """The first pickled weights file of a listing with no safetensors (nothing we may load), else None."""
    if any(fnmatch.fnmatch(p, "*.safetensors") for p in paths):
        return None
    return next((p for p in paths if any(fnmatch.fnmatch(p, pattern) for pattern in PICKLED_WEIGHTS)), None)


def require_hex(value, length: int, what: str) -> str:
    """``value`` when it is ``length`` lowercase hex digits. Commit shas and oids name folders and files in
    the cache, so anything else (``../``, a slash, a newline) is refused before it reaches the disk."""
    if isinstance(value, str) and re.fullmatch(f"[0-9a-f]{{{length}}}", value):
        return value
    raise UnsafeName(f"{what} is {value!r}, not {length} hex digits")


def _path_problem(path) -> str | None:
    if not isinstance(path, str):
        return "is not text"
    if not path:
        return "is empty"
    if "\\" in path:
        return "contains a backslash (a folder separator on Windows)"
    if "\0" in path:
        return "contains a NUL character"
    if path.startswith("/"):
        return "is absolute"
    if PureWindowsPath(path).drive:
        return "starts with a drive letter"
    parts = path.split("/")
    for bad, problem in (("", "has an empty part"), ("..", "has a '..' part"), (".", "has a '.' part")):
        if bad in parts:
            return problem
    return None


def safe_relpath(path, what: str = "the path") -> str:
    """``path`` when it is a plain relative path of names joined by '/': listed files become
    ``snapshots/<commit>/<path>`` and revisions ``refs/<revision>``, so they must stay below that folder on
    every system (symlinks on the disk are ``_inside``'s job)."""
    problem = _path_problem(path)
    if problem:
        raise UnsafeName(f"{what} {path!r} {problem}")
    return path


def storage_folder(cache_dir: Path, repo_id: str) -> Path:
    return Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))


def free_space(path: Path) -> int:
    return shutil.disk_usage(paths.existing_parent(Path(path))).free


def _human(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


_offline_setting = False   # the app's Offline switch (Settings), applied by set_offline


def set_offline(on: bool) -> None:
    global _offline_setting
    _offline_setting = bool(on)


def offline_mode() -> bool:
    """The app's Offline switch, HF_HUB_OFFLINE now, or HF_HUB_OFFLINE as huggingface_hub read it at import
    (it then blocks every request)."""
    from huggingface_hub import constants

    return (_offline_setting or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
            or constants.HF_HUB_OFFLINE)


# ----------------------------------------------------------------------------- tokens

def current_token() -> str | None:
    """The token huggingface_hub would use (HF_TOKEN, then the stored login). Never log it."""
    return get_token()


def save_token(token: str) -> None:
    """Validate and store a token where huggingface_hub keeps it (needs network to the hub)."""
    from huggingface_hub import login

    login(token=token, add_to_git_credential=False, skip_if_logged_in=False)


# ----------------------------------------------------------------------------- cache lookup

def _read_tree(storage: Path, commit: str) -> dict | None:
    try:
        data = json.loads((storage / "trees" / f"{commit}.json").read_text())
        return data["files"] if data.get("format_version") == 1 else None
    except (OSError, ValueError, KeyError):
        return None


def _write_tree(storage: Path, commit: str, files: list[RepoFile]) -> None:
    """Same format as huggingface_hub's tree cache, so offline checks know the full file list."""
    entries = {}
    for f in files:
        e = {"size": f.size, "blob_id": f.blob_id}
        if f.lfs is not None:
            e.update(lfs_sha256=f.lfs.sha256, lfs_size=f.lfs.size)
        entries[f.path] = e
    target = _inside(storage, storage / "trees" / f"{commit}.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"format_version": 1, "files": entries}, indent=1))
    tmp.replace(target)


def _commit_from_cache(storage: Path, revision: str) -> str | None:
    if COMMIT_RE.fullmatch(revision):
        return revision if (storage / "snapshots" / revision).is_dir() else None
    ref = storage / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else ""
    return commit if COMMIT_RE.fullmatch(commit) else None  # a ref naming anything but a commit is no cache


def missing_from_cache(repo_id: str, revision: str = "main", cache_dir: Path | None = None,
                       allow=ALLOW_PATTERNS, ignore=IGNORE_PATTERNS) -> tuple[Path | None, list[str]]:
    """(snapshot folder, files still missing) using only the disk. Never touches the network.

    Uses the tree listing saved at download time; without one (a cache filled by an older tool) the
    snapshot must at least hold config.json and every shard named by a safetensors index.
    """
    storage = storage_folder(cache_dir or paths.models_dir(), repo_id)
    commit = _commit_from_cache(storage, revision)
    if commit is None:
        return None, ["(the whole repository)"]
    snap = storage / "snapshots" / commit
    tree = _read_tree(storage, commit)
    if tree is not None:
        expected = [p for p in tree if wanted(p, allow, ignore)]
    else:
        expected = ["config.json"]
        for index in snap.glob("*.safetensors.index.json"):
            try:
                expected += sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError):
                expected.append(index.name)
        if not any(snap.glob("*.safetensors")) and len(expected) == 1:
            expected.append("*.safetensors")
    missing = [p for p in expected if not (snap / p).exists()]
    return snap, missing


def find_cached(repo_id: str, revision: str = "main", cache_dir: Path | None = None,
                files: Iterable[str] | None = None) -> Path | None:
    """Snapshot folder when the repo (or the named files of it) is fully in the cache, else None (no network)."""
    allow, ignore = (tuple(files), FILES_IGNORE) if files else (ALLOW_PATTERNS, IGNORE_PATTERNS)
    snap, missing = missing_from_cache(repo_id, revision, cache_dir, allow, ignore)
    return snap if snap is not None and not missing else None


# ----------------------------------------------------------------------------- the job

class DownloadJob:
    """Fetch several repos (a pair's target and drafter) with one aggregated progress.

    Call ``start()``; it returns at once. Callbacks run on the download thread: ``on_progress(Progress)``
    (throttled), ``on_state(state)`` and ``on_finished(job)`` (once, after done/failed/cancelled).
    ``cancel()`` is safe from any thread and stops within about a chunk (64 KiB).
    """

    def __init__(self, repos: list[tuple[str, str]], *, cache_dir: str | os.PathLike | None = None,
                 endpoint: str | None = None, token: str | bool | None = None, offline: bool | None = None,
                 allow_patterns: Iterable[str] = ALLOW_PATTERNS, ignore_patterns: Iterable[str] = IGNORE_PATTERNS,
                 on_progress: Callable[[Progress], None] | None = None,
                 on_state: Callable[[str], None] | None = None,
                 on_finished: Callable[["DownloadJob"], None] | None = None,
                 free_space_fn: Callable[[Path], int] = free_space, max_retries: int = 5,
                 retry_wait: float = 0.5, timeout: float = 30.0, progress_interval: float = 0.1):
        # (repo_id, revision) or (repo_id, revision, files): files, exact names or patterns, replace the allow list
        self.repos = [(r[0], r[1] or "main", tuple(r[2]) if len(r) > 2 and r[2] else None) for r in repos]
        self.cache_dir = Path(cache_dir) if cache_dir else paths.models_dir()
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        self._token = token
        self.offline = offline_mode() if offline is None else offline
        self.allow, self.ignore = tuple(allow_patterns), tuple(ignore_patterns)
        self.on_progress, self.on_state, self.on_finished = on_progress, on_state, on_finished
        self.free_space_fn, self.max_retries, self.retry_wait = free_space_fn, max_retries, retry_wait
        self.timeout, self.progress_interval = timeout, progress_interval
        self.result: dict[str, Path] = {}
        self.error: DownloadError | None = None
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._progress = Progress("idle", 0, 0, 0, 0.0, None, 0, 0)
        self._samples: deque[tuple[float, int]] = deque(maxlen=50)
        self._last_emit = 0.0

    @classmethod
    def for_pair(cls, pair, engine: str | None = None, **kwargs) -> "DownloadJob":
        """The pair's repos, or the engine's variant files instead of the target's weights (catalog.py)."""
        return cls(pair.repos(engine), **kwargs)

    # --- control -------------------------------------------------------------------------------
    def start(self) -> "DownloadJob":
        if self._thread is not None:
            raise RuntimeError("A DownloadJob runs once; create a new one to retry (it resumes).")
        self._thread = threading.Thread(target=self._main, name="dflash-download", daemon=True)
        self._thread.start()
        return self

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True when the job has finished within ``timeout``."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.finished

    @property
    def state(self) -> str:
        return self._progress.state

    @property
    def progress(self) -> Progress:
        return self._progress

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "cancelled")

    # --- internals: bookkeeping -----------------------------------------------------------------
    def _set(self, emit: bool = True, **changes) -> None:
        with self._lock:
            old = self._progress
            self._progress = replace(old, **changes)
        if changes.get("state", old.state) != old.state and self.on_state:
            self._safe(self.on_state, self._progress.state)
        if emit:
            self._emit(force="state" in changes)

    def _emit(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.on_progress and (force or now - self._last_emit >= self.progress_interval):
            self._last_emit = now
            self._safe(self.on_progress, self._progress)

    @staticmethod
    def _safe(fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # a broken UI callback must not kill the download
            log.exception("Download callback failed")

    def _advance(self, n: int) -> None:
        now = time.monotonic()
        p = self._progress
        received = p.bytes_received + max(n, 0)
        self._samples.append((now, received))
        while len(self._samples) > 2 and now - self._samples[0][0] > 5.0:
            self._samples.popleft()
        t0, r0 = self._samples[0]
        speed = (received - r0) / (now - t0) if now - t0 > 0.05 else p.speed_bps
        done = p.bytes_done + n
        eta = (p.bytes_total - done) / speed if speed > 0 else None
        self._set(emit=False, bytes_done=done, bytes_received=received, speed_bps=speed, eta_s=eta)
        self._emit()

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise Cancelled()

    def _scrub(self, text: str) -> str:
        token = self._token if isinstance(self._token, str) else None
        for secret in filter(None, (token, get_token() if self._token is not False else None)):
            text = text.replace(secret, "***")
        return text

    # --- internals: main flow -------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._set(state="resolving")
            plans = [self._plan(repo, rev, files) for repo, rev, files in self.repos]
            files = [f for plan in plans for f in plan]
            todo = [f for f in files if not f.pointer.exists()]
            cached = sum(f.size for f in files if f.pointer.exists())
            self._set(state="checking", bytes_total=sum(f.size for f in files), files_total=len(files),
                      files_done=len(files) - len(todo),
                      bytes_done=cached + sum(_size(f.partial) for f in todo if not f.blob.exists())
                      + sum(f.size for f in todo if f.blob.exists()))
            self._check_disk(todo)
            self._set(state="downloading")
            for f in todo:
                self._check_cancel()
                self._set(current_repo=f.repo_id, current_file=f.path)
                self._fetch(f)
                self._set(files_done=self._progress.files_done + 1)
            self._set(state="done", current_file=None, eta_s=0.0)
        except Cancelled:
            self._set(state="cancelled")
        except DownloadError as exc:
            exc.message = self._scrub(exc.message)
            exc.args = (exc.message,)
            self.error = exc
            log.warning("Download failed (%s): %s", exc.kind, exc.message)
            self._set(state="failed")
        except Exception as exc:  # noqa: BLE001 (unexpected: still report, never crash the app)
            self.error = DownloadError("unexpected", self._scrub(f"Download failed unexpectedly: {exc!r}"))
            log.error("Download failed unexpectedly: %s", self.error.message)
            self._set(state="failed")
        finally:
            if self.on_finished:
                self._safe(self.on_finished, self)

    def _headers(self) -> dict[str, str]:
        return build_hf_headers(token=self._token, library_name="dflash-desktop")

    def _plan(self, repo_id: str, revision: str, files: tuple[str, ...] | None = None) -> list[_File]:
        """Resolve the revision and list wanted files; offline (or unreachable hub) uses the cache."""
        self._check_request(repo_id, revision)
        allow, ignore = (files, FILES_IGNORE) if files else (self.allow, self.ignore)
        storage = storage_folder(self.cache_dir, repo_id)
        if self.offline:
            return self._plan_offline(repo_id, revision, storage, "Offline mode is on",
                                      "Turn off offline mode in Settings and download it again", allow, ignore)
        api = HfApi(endpoint=self.endpoint, token=self._token, library_name="dflash-desktop")
        try:
            info = api.model_info(repo_id, revision=revision, timeout=self.timeout)
            tree = [f for f in api.list_repo_tree(repo_id, revision=info.sha, recursive=True)
                    if isinstance(f, RepoFile)]
        except (httpx2.ConnectError, httpx2.TimeoutException) as exc:
            log.info("Hub unreachable (%s); looking in the cache", type(exc).__name__)
            return self._plan_offline(repo_id, revision, storage, f"The hub at {self.endpoint} cannot be reached",
                                      "Check the internet connection and download it again", allow, ignore)
        except Exception as exc:  # noqa: BLE001 (huggingface_hub raises many kinds; _map_error names each for the user)
            raise self._map_error(exc, repo_id, revision) from None
        if not info.sha:
            raise DownloadError("unexpected", f"{self.endpoint} did not return a commit for {repo_id}; "
                                              "is HF_ENDPOINT a Hugging Face compatible mirror?", repo_id)
        missing = [f for f in files or () if not any(c in f for c in "*?[") and f not in {e.path for e in tree}]
        if missing:
            raise DownloadError("file_not_found", f"{repo_id} has no file {missing[0]!r}, which the catalog names. "
                                                "Refresh the catalog, or report the pair's entry.", repo_id)
        if not files and (pickled := pickled_only([f.path for f in tree])):   # a whole repo, not named files
            raise DownloadError("pickled_weights", f"{repo_id} publishes its weights only as pickled PyTorch files "
                                f"({pickled}), which DFlash Desktop never loads: unpickling a file can run code. "
                                "Nothing was downloaded. Pick another model or drafter (the speculation box lists "
                                "this model's others), or ask the publisher for a safetensors copy.", repo_id)
        commit, files = self._checked_listing(repo_id, info.sha, tree, storage, allow, ignore)
        _write_tree(storage, commit, tree)
        if revision != commit:
            ref = _inside(storage, storage / "refs" / revision)
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(commit)
        snapshot = _inside(storage, storage / "snapshots" / commit)
        snapshot.mkdir(parents=True, exist_ok=True)
        self.result[repo_id] = snapshot
        return files

    def _check_request(self, repo_id: str, revision: str) -> None:
        """The repo id and revision come from the catalog, which may come from the network: both name folders."""
        try:
            validate_repo_id(repo_id)
            safe_relpath(revision, "the revision")
        except ValueError as exc:
            raise DownloadError("unsafe_name", f"Cannot download {repo_id!r}: {str(exc).rstrip('.')}. Fix the "
                                               "pair's entry in the catalog.", repo_id) from None

    def _checked_listing(self, repo_id: str, sha, tree: list[RepoFile], storage: Path, allow, ignore
                         ) -> tuple[str, list[_File]]:
        """The commit and the wanted files, every name that becomes a path checked before anything is written."""
        try:
            commit = require_hex(sha, 40, "the commit sha")
            return commit, [_listed_file(repo_id, commit, f, storage)
                            for f in tree if wanted(f.path, allow, ignore)]
        except UnsafeName as exc:
            raise DownloadError("unsafe_name", f"{self.endpoint} sent an unsafe file list for {repo_id}: {exc}. "
                                               "Nothing was written for it. The repository or the mirror is broken "
                                               "or hostile: report it to its owner, or use another mirror "
                                               "(HF_ENDPOINT).", repo_id) from None

    def _plan_offline(self, repo_id: str, revision: str, storage: Path, reason: str, remedy: str, allow,
                      ignore) -> list[_File]:
        """From the cache alone; ``reason``: why (offline mode, or the hub out of reach), ``remedy``: what to do
        about that one, so the message never points at a switch that is not on."""
        snap, missing = missing_from_cache(repo_id, revision, self.cache_dir, allow, ignore)
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            which = "" if revision == "main" else f" (revision '{revision}')"
            raise DownloadError("offline_missing",
                                f"{reason}, and {repo_id}{which} is not fully on this computer (missing {shown}). "
                                f"{remedy}; the files already downloaded are kept.", repo_id)
        self.result[repo_id] = snap
        return []

    def _check_disk(self, todo: list[_File]) -> None:
        need = sum(f.size - _size(f.partial) for f in todo if not f.blob.exists())
        if not need:
            return
        free = self.free_space_fn(self.cache_dir)
        if need + DISK_RESERVE > free:
            raise DownloadError("disk_full",
                                f"Not enough disk space in {self.cache_dir}: the download needs {_human(need)} "
                                f"(plus {_human(DISK_RESERVE)} to spare) but only {_human(free)} is free. Free up "
                                f"{_human(need + DISK_RESERVE - free)} or choose another models folder in Settings.")

    # --- internals: one file --------------------------------------------------------------------
    def _fetch(self, f: _File) -> None:
        """Download (or resume), verify and link one file; its blob, partial file and snapshot entry are checked
        to stay in the repo's folder first, so no write, append, delete or link below can go elsewhere."""
        for path in (f.blob, f.partial, f.pointer):
            _inside(f.storage, path)
        f.blob.parent.mkdir(parents=True, exist_ok=True)
        if not f.blob.exists():
            attempts, refetched = 0, False
            while True:
                self._check_cancel()
                before = _size(f.partial)
                try:
                    self._stream(f, before)
                    if _size(f.partial) < f.size:
                        raise _Transient("the connection closed before the end of the file")
                except _Transient as exc:
                    attempts = 0 if _size(f.partial) > before else attempts + 1
                    if attempts > self.max_retries:
                        raise DownloadError(
                            "connection",
                            f"Connection lost while downloading {f.path} from {f.repo_id} ({exc}); gave up after "
                            f"{self.max_retries} retries. Check your internet connection or proxy, then retry: the "
                            f"download resumes where it stopped.", f.repo_id) from None
                    self._set(retries=self._progress.retries + 1)
                    log.info("Retrying %s after: %s", f.path, exc)
                    if self._cancel.wait(min(self.retry_wait * 2 ** max(attempts - 1, 0), 8.0)):
                        raise Cancelled() from None
                    continue
                if self._verify(f):
                    f.partial.replace(f.blob)
                    break
                self._advance(-_size(f.partial))
                f.partial.unlink(missing_ok=True)
                if refetched:
                    raise DownloadError(
                        "checksum",
                        f"{f.path} from {f.repo_id} failed its checksum twice (expected "
                        f"{'sha256' if f.sha256 else 'git sha1'} {f.etag[:12]}…). The file on the server or a proxy "
                        "on the way is damaging it; try again later or use another mirror.", f.repo_id)
                log.warning("Checksum mismatch for %s; fetching it again", f.path)
                refetched = True
        _link(f.blob, f.pointer)

    def _stream(self, f: _File, start: int) -> None:
        url = hf_hub_url(f.repo_id, f.path, revision=f.commit, endpoint=self.endpoint)
        headers = self._headers()
        headers["Accept-Encoding"] = "identity"  # byte offsets must match the file
        if start:
            headers["Range"] = f"bytes={start}-"
        timeout = httpx2.Timeout(self.timeout, connect=min(self.timeout, 15.0))
        try:
            with get_session().stream("GET", url, headers=headers, timeout=timeout) as r:
                if r.status_code == 416:  # our partial is longer than the file: start over
                    self._advance(-start)
                    f.partial.unlink(missing_ok=True)
                    raise _Transient("the server refused the resume offset")
                if r.status_code in (408, 429) or r.status_code >= 500:
                    raise _Transient(f"server answered HTTP {r.status_code}")
                if r.status_code >= 400:
                    r.read()
                    try:
                        hf_raise_for_status(r)
                    except Exception as exc:  # noqa: BLE001 (as above: every failure becomes a DownloadError)
                        raise self._map_error(exc, f.repo_id, f.commit, f.path) from None
                mode = "ab"
                if start and r.status_code != 206:  # Range ignored: the body is the whole file
                    self._advance(-start)
                    mode = "wb"
                with open(f.partial, mode) as out:
                    for chunk in r.iter_bytes(CHUNK):
                        self._check_cancel()
                        out.write(chunk)
                        self._advance(len(chunk))
        except httpx2.ProxyError as exc:
            raise DownloadError("proxy", f"The proxy refused the connection ({exc}). Check HTTPS_PROXY / "
                                         "your proxy settings.", f.repo_id) from None
        except httpx2.TransportError as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from None
        except OSError as exc:
            if exc.errno == 28:  # ENOSPC
                raise DownloadError("disk_full", f"The disk holding {self.cache_dir} filled up while writing "
                                                 f"{f.path}. Free some space and retry; the download resumes.",
                                    f.repo_id) from None
            raise

    def _verify(self, f: _File) -> bool:
        """Size and hash check; sha256 for LFS files, git blob sha1 for small ones."""
        if _size(f.partial) != f.size:
            return False
        self._set(state="verifying")
        h = hashlib.sha256() if f.sha256 else hashlib.sha1(b"blob %d\0" % f.size)
        with open(f.partial, "rb") as fh:
            while chunk := fh.read(4 * 2**20):
                self._check_cancel()
                h.update(chunk)
        self._set(state="downloading")
        return h.hexdigest() == f.etag

    def _map_error(self, exc: Exception, repo_id: str, revision: str, path: str | None = None) -> DownloadError:
        """Turn a huggingface_hub error into a message that names the problem and the fix."""
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
        server_msg = response.headers.get("X-Error-Message", "") if response is not None else ""
        page = f"https://huggingface.co/{repo_id}"
        signed_in = bool(self._token) if self._token is not None else bool(get_token())
        if status == 401 and "Invalid credentials" in server_msg:
            return DownloadError("auth", "The hub rejected your Hugging Face token (expired or revoked). "
                                         "Sign in again with a new token in Settings.", repo_id)
        if isinstance(exc, GatedRepoError) or status == 403:
            who = "your account has not been granted access yet" if signed_in else "you are not signed in"
            return DownloadError("gated", f"{repo_id} is gated and {who}: request access at {page} and sign in "
                                          "with your Hugging Face token (Settings).", repo_id)
        if isinstance(exc, RevisionNotFoundError):
            return DownloadError("revision_not_found", f"Revision '{revision}' does not exist in {repo_id}. "
                                                       "Refresh the catalog or pick another revision.", repo_id)
        if status == 401:  # the hub answers 401 for private, gated and missing repos alike
            return DownloadError("gated", f"{repo_id} was not found or needs permission: check the name; if it "
                                          f"is gated or private, request access at {page} and sign in with your "
                                          "Hugging Face token (Settings).", repo_id)
        if isinstance(exc, RepositoryNotFoundError):
            return DownloadError("repo_not_found", f"The repository {repo_id} was not found on {self.endpoint}. "
                                                   "It may have been renamed or removed; refresh the catalog.",
                                 repo_id)
        if isinstance(exc, EntryNotFoundError):
            return DownloadError("file_not_found", f"{path} is listed in {repo_id} but cannot be downloaded "
                                                   "(HTTP 404): the repository changed. Retry to fetch its new "
                                                   "file list.", repo_id)
        if isinstance(exc, HfHubHTTPError):
            return DownloadError("http", f"The hub answered HTTP {status} for {repo_id}. Try again later.", repo_id)
        return DownloadError("unexpected", f"Could not get {repo_id}: {type(exc).__name__}: {exc}", repo_id)


def _listed_file(repo_id: str, commit: str, entry: RepoFile, storage: Path) -> _File:
    """A listed file with its path and oid checked: they become the snapshot entry and the blob's name."""
    path = safe_relpath(entry.path)
    if entry.lfs is not None:
        sha256 = require_hex(entry.lfs.sha256, 64, f"the sha256 of {path}")
        return _File(repo_id, commit, path, entry.size, sha256, sha256, storage)
    return _File(repo_id, commit, path, entry.size, require_hex(entry.blob_id, 40, f"the git oid of {path}"), None,
                 storage)


def _inside(root: Path, path: Path) -> Path:
    """``path`` when its real location (every symlink followed) is inside ``root``, the repo's folder.

    A symlink planted in the cache must never make us write, append to, delete or link a file elsewhere.
    """
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if real.is_relative_to(top):
        return path
    steps = path.relative_to(root).parts if path.is_relative_to(root) else ()
    link = next((root.joinpath(*steps[:i]) for i in range(1, len(steps) + 1)
                 if root.joinpath(*steps[:i]).is_symlink()), path)
    raise DownloadError("unsafe_cache", f"{link} is a symbolic link to {os.path.realpath(link)}, outside the "
                                        f"model's folder {root}, so downloading would write there. Nothing was "
                                        "written there. Delete that link (or the model's folder) and download "
                                        "again.")


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _link(blob: Path, pointer: Path) -> None:
    """Snapshot entry -> blob: relative symlink like huggingface_hub, else hard link, else copy."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.exists() or pointer.is_symlink():
        pointer.unlink()
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
    except OSError:
        try:
            os.link(blob, pointer)
        except OSError:
            shutil.copyfile(blob, pointer)
