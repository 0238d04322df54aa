"""A real HTTP server on 127.0.0.1 that answers like the Hugging Face hub does for huggingface_hub 2.4.0.

Endpoints (what the library and our downloader call):
  GET  /api/models/{repo}/revision/{rev}   model info with "sha" (RepoNotFound / RevisionNotFound codes)
  GET  /api/models/{repo}/tree/{rev}       recursive listing: path, size, oid (git sha1), lfs {oid, size}
  HEAD /{repo}/resolve/{rev}/{file}        X-Repo-Commit, ETag, X-Linked-Etag, X-Linked-Size, Content-Length
  GET  /{repo}/resolve/{rev}/{file}        body, honouring "Range: bytes=N-" with 206 + Content-Range

Fault knobs on ``HubServer`` (set by tests): ``drop_once`` (paths cut mid-body on their first GET),
``ignore_range``, ``corrupt`` (path -> how many GETs serve damaged bytes), ``slow_bps`` (pace bodies),
gated repos (401 without a token, 403 with a token that has no access), ``static`` plain files
(path -> bytes). Hostile listings: a repo's files may have any path (``../x``, ``/abs``), its commits any
sha, and ``Repo.listed_oids`` makes the listing announce another oid than the file's. Routes match the
raw request path and percent-decode each part, like the hub, so a revision containing ``%2F`` arrives
whole. Every request is recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import pytest

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pkl", ".gguf")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]
    commits: dict[str, str]  # revision name -> commit sha
    gated: bool = False
    allowed_tokens: set[str] = field(default_factory=set)
    listed_oids: dict[str, str] = field(default_factory=dict)  # path -> oid the listing claims (hostile hubs)

    def is_lfs(self, path: str) -> bool:
        return path.endswith(LFS_SUFFIXES)

    def etag(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if self.is_lfs(path) else git_blob_sha1(data)


def make_repo(seed: int, shards: int = 2, shard_size: int = 300_000, extra: dict | None = None, **kw) -> Repo:
    """Small generated model repo: random *.safetensors shards plus config/tokenizer JSON files."""
    rnd = __import__("random").Random(seed)
    files = {f"model-{i + 1:05d}-of-{shards:05d}.safetensors": rnd.randbytes(shard_size) for i in range(shards)}
    files["model.safetensors.index.json"] = json.dumps(
        {"weight_map": {f"layer.{i}.weight": name for i, name in enumerate(sorted(files))}}).encode()
    files["config.json"] = json.dumps({"model_type": "qwen3", "hidden_size": 64, "seed": seed}).encode()
    files["tokenizer.json"] = json.dumps({"version": "1.0", "model": {"vocab": {"a": 0}}}).encode()
    files["tokenizer_config.json"] = json.dumps({"chat_template": "{{ messages }}"}).encode()
    files.update(extra or {})
    commit = hashlib.sha1(f"commit-{seed}".encode()).hexdigest()
    return Repo(files=files, commits={"main": commit, commit: commit}, **kw)


def folder_repo(folder, names=None, seed: str = "x") -> Repo:
    """A repo serving a folder's files (those in `names`, or all), at a commit named by the seed."""
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir())
             if p.is_file() and (names is None or p.name in names)}
    commit = hashlib.sha1(seed.encode()).hexdigest()
    return Repo(files=files, commits={"main": commit, commit: commit})


class HubServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.repos: dict[str, Repo] = {}
        self.requests: list[dict] = []
        self.body_bytes: dict[str, int] = {}  # file path -> body bytes sent, all requests
        self.drop_once: set[str] = set()
        self.ignore_range = False
        self.corrupt: dict[str, int] = {}
        self.slow_bps: int | None = None
        self.static: dict[str, bytes] = {}  # extra plain files, e.g. a catalog.json
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def gets(self, path_suffix: str) -> list[dict]:
        return [r for r in self.requests if r["method"] == "GET" and r["path"].endswith(path_suffix)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HubServer

    def log_message(self, *args):  # keep pytest output clean
        pass

    # --- helpers ---------------------------------------------------------------------------------
    def _record(self):
        self._req = {"method": self.command, "path": unquote(urlsplit(self.path).path),
                     "headers": dict(self.headers.items()), "sent": 0}
        with self.server.lock:
            self.server.requests.append(self._req)

    def _json(self, status: int, payload, headers: dict | None = None):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str):
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._json(status, {"error": message}, headers)

    def _repo_rev(self, repo_id: str, rev: str):
        repo = self.server.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None, None
        commit = repo.commits.get(rev)
        if commit is None:
            self._error(404, "RevisionNotFound", "Invalid rev id: " + rev)
            return None, None
        return repo, commit

    # --- routes ----------------------------------------------------------------------------------
    def _route(self, pattern: str):
        """Match the raw path, then percent-decode each group (a quoted revision may contain '/')."""
        m = re.fullmatch(pattern, urlsplit(self.path).path)
        return [unquote(g) if g else g for g in m.groups()] if m else None

    def do_GET(self):
        self._record()
        path = unquote(urlsplit(self.path).path)
        if path in self.server.static:
            body = self.server.static[path]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif m := self._route(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)"):
            repo, commit = self._repo_rev(m[0], m[1])
            if repo:
                self._json(200, {"id": m[0], "sha": commit, "private": False,
                                 "gated": "manual" if repo.gated else False,
                                 "siblings": [{"rfilename": p} for p in sorted(repo.files)]})
        elif m := self._route(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?"):
            repo, commit = self._repo_rev(m[0], m[1])
            if repo:
                self._json(200, [self._tree_entry(repo, p) for p in sorted(repo.files)])
        elif m := self._route(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)"):
            self._resolve(*m, body=True)
        else:
            self._error(404, None, "Not found")

    def do_HEAD(self):
        self._record()
        if m := self._route(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)"):
            self._resolve(*m, body=False)
        else:
            self._error(404, None, "Not found")

    @staticmethod
    def _tree_entry(repo: Repo, path: str) -> dict:
        data = repo.files[path]
        oid = repo.listed_oids.get(path)
        entry = {"type": "file", "path": path, "size": len(data), "oid": git_blob_sha1(data)}
        if repo.is_lfs(path):
            entry["lfs"] = {"oid": oid or hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        elif oid:
            entry["oid"] = oid
        return entry

    def _resolve(self, repo_id: str, rev: str, file: str, body: bool):
        repo, commit = self._repo_rev(repo_id, rev)
        if repo is None:
            return
        if repo.gated:
            auth = self.headers.get("Authorization", "")
            if not auth:
                return self._error(401, "GatedRepo", "Access to model is restricted. You must have access to it "
                                                     "and be authenticated to access it. Please log in.")
            if auth.removeprefix("Bearer ") not in repo.allowed_tokens:
                return self._error(403, "GatedRepo", "Access to model is restricted and you are not in the "
                                                     "authorized list.")
        if file not in repo.files:
            return self._error(404, "EntryNotFound", f"{file} does not exist on \"{rev}\"")
        data = repo.files[file]
        headers = {"X-Repo-Commit": commit, "ETag": f'"{repo.etag(file)}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if repo.is_lfs(file):
            headers["X-Linked-Etag"] = f'"{repo.etag(file)}"'
            headers["X-Linked-Size"] = str(len(data))
        srv = self.server
        if body:
            with srv.lock:
                if srv.corrupt.get(file, 0) > 0:
                    srv.corrupt[file] -= 1
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        rng = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        if rng and not srv.ignore_range:
            start = int(rng[1])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        else:
            self.send_response(200)
        payload = data[start:]
        headers["Content-Length"] = str(len(payload))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not body:
            return
        drop = False
        with srv.lock:
            if file in srv.drop_once:
                srv.drop_once.discard(file)
                drop = True
        if drop:  # send part of the body, then cut the connection like a flaky network would
            cut = len(payload) // 2
            self.wfile.write(payload[:cut])
            self.wfile.flush()
            self._count(file, cut)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        step = 8192 if srv.slow_bps else 65536
        try:
            for i in range(0, len(payload), step):
                chunk = payload[i:i + step]
                self.wfile.write(chunk)
                self._count(file, len(chunk))
                if srv.slow_bps:
                    self.wfile.flush()
                    time.sleep(len(chunk) / srv.slow_bps)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _count(self, file: str, n: int):
        """Body bytes written to the socket (some may never reach a client that already hung up)."""
        with self.server.lock:
            self._req["sent"] += n
            self.server.body_bytes[file] = self.server.body_bytes.get(file, 0) + n


@pytest.fixture
def hub():
    """A fresh fake hub per test, served from a background thread."""
    server = HubServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


if __name__ == "__main__":  # manual poking: python tests/hub_server.py
    srv = HubServer()
    srv.repos["demo/tiny"] = make_repo(1)
    print("serving", srv.url, "repo demo/tiny; HF_ENDPOINT=" + srv.url, flush=True)
    os.environ["HF_ENDPOINT"] = srv.url
    srv.serve_forever()
