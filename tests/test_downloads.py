"""Downloads against a real local HTTP server that answers like the hub (tests/hub_server.py)."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from dflash_desktop.downloads import DownloadJob, find_cached, missing_from_cache, storage_folder, wanted
from tests.hub_server import hub, make_repo  # noqa: F401  (fixture)

SHARD1 = "model-00001-of-00002.safetensors"
TOKEN = "hf_TESTsecretTOKEN0123456789abcdef"
WAIT = 30  # seconds; every wait is bounded


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    from huggingface_hub import constants  # read at import: this machine may run with HF_HUB_OFFLINE=1
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def job(hub, repos, cache, **kw) -> DownloadJob:
    kw.setdefault("token", False)
    kw.setdefault("retry_wait", 0.02)
    return DownloadJob(repos, cache_dir=cache, endpoint=hub.url, **kw)


def run(j: DownloadJob) -> DownloadJob:
    assert j.start().wait(WAIT), f"download did not finish in {WAIT}s (state {j.state})"
    return j


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def header(req: dict, name: str) -> str | None:
    return next((v for k, v in req["headers"].items() if k.lower() == name.lower()), None)


def test_pair_download_fetches_both_repos_with_aggregated_progress(hub, tmp_path):
    hub.repos["org/target"] = make_repo(1, extra={"pytorch_model.bin": b"pickle" * 100, "weights.pkl": b"p",
                                                  "original/consolidated.00.pth": b"x", "modeling.py": b"evil"})
    hub.repos["org/draft"] = make_repo(2, shards=1)
    events, states = [], []
    j = run(job(hub, [("org/target", "main"), ("org/draft", "main")], tmp_path / "cache",
                on_progress=events.append, on_state=states.append, progress_interval=0))
    assert j.state == "done", j.error
    for repo_id in ("org/target", "org/draft"):
        snap = j.result[repo_id]
        for name, data in hub.repos[repo_id].files.items():
            if wanted(name):
                assert (snap / name).read_bytes() == data
        assert find_cached(repo_id, cache_dir=tmp_path / "cache") == snap
    snap = j.result["org/target"]
    for pickled in ("pytorch_model.bin", "weights.pkl", "original/consolidated.00.pth", "modeling.py"):
        assert not (snap / pickled).exists()
    assert not any("pytorch_model.bin" in r["path"] or ".pkl" in r["path"] for r in hub.requests)
    total = sum(len(d) for r in ("org/target", "org/draft") for n, d in hub.repos[r].files.items() if wanted(n))
    last = events[-1]
    assert (last.bytes_done, last.bytes_total, last.bytes_received) == (total, total, total)
    assert last.files_done == last.files_total == 11
    done_series = [e.bytes_done for e in events]
    assert done_series == sorted(done_series)  # monotonic without faults
    assert any(e.speed_bps > 0 for e in events)
    assert states[:3] == ["resolving", "checking", "downloading"] and states[-1] == "done"
    # huggingface_hub itself finds our files (same cache layout).
    from huggingface_hub import try_to_load_from_cache
    found = try_to_load_from_cache("org/target", SHARD1, cache_dir=tmp_path / "cache")
    assert found and Path(found).read_bytes() == hub.repos["org/target"].files[SHARD1]


def test_dropped_connection_resumes_with_range(hub, tmp_path):
    hub.repos["org/m"] = make_repo(3)
    hub.drop_once.add(SHARD1)
    j = run(job(hub, [("org/m", "main")], tmp_path))
    assert j.state == "done", j.error
    gets = hub.gets(SHARD1)
    assert len(gets) == 2
    size = len(hub.repos["org/m"].files[SHARD1])
    resumed_at = int(header(gets[1], "Range").removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= gets[0]["sent"] == size // 2  # resumed from what had arrived
    assert gets[1]["sent"] == size - resumed_at  # only the rest was sent again
    assert sha((j.result["org/m"] / SHARD1).read_bytes()) == sha(hub.repos["org/m"].files[SHARD1])
    assert j.progress.retries == 1


def test_server_that_ignores_range_still_gives_a_correct_file(hub, tmp_path):
    hub.repos["org/m"] = make_repo(4)
    hub.drop_once.add(SHARD1)
    hub.ignore_range = True
    j = run(job(hub, [("org/m", "main")], tmp_path))
    assert j.state == "done", j.error
    data = hub.repos["org/m"].files[SHARD1]
    assert header(hub.gets(SHARD1)[1], "Range")  # we asked to resume...
    assert hub.body_bytes[SHARD1] == len(data) // 2 + len(data)  # ...and got the whole file again
    assert (j.result["org/m"] / SHARD1).read_bytes() == data
    assert j.progress.bytes_done == j.progress.bytes_total


def test_corrupt_file_is_removed_and_fetched_again(hub, tmp_path):
    hub.repos["org/m"] = make_repo(5)
    hub.corrupt[SHARD1] = 1
    j = run(job(hub, [("org/m", "main")], tmp_path))
    assert j.state == "done", j.error
    assert len(hub.gets(SHARD1)) == 2
    assert (j.result["org/m"] / SHARD1).read_bytes() == hub.repos["org/m"].files[SHARD1]


def test_persistently_corrupt_file_gives_a_clear_error_and_leaves_nothing(hub, tmp_path):
    hub.repos["org/m"] = make_repo(6)
    hub.corrupt[SHARD1] = 99
    j = run(job(hub, [("org/m", "main")], tmp_path))
    assert j.state == "failed" and j.error.kind == "checksum"
    assert SHARD1 in j.error.message and "checksum" in j.error.message
    assert len(hub.gets(SHARD1)) == 2  # one re-fetch, not an endless loop
    blobs = storage_folder(tmp_path, "org/m") / "blobs"
    etag = sha(hub.repos["org/m"].files[SHARD1])
    assert not (blobs / etag).exists() and not (blobs / f"{etag}.incomplete").exists()


@pytest.mark.parametrize("token, status", [(False, 401), (TOKEN, 403)])
def test_gated_repo_says_how_to_get_access_and_never_leaks_the_token(hub, tmp_path, caplog, token, status):
    hub.repos["org/gated"] = make_repo(7, gated=True, allowed_tokens={"hf_someoneelse"})
    caplog.set_level(logging.DEBUG)
    j = run(job(hub, [("org/gated", "main")], tmp_path, token=token))
    assert j.state == "failed" and j.error.kind == "gated"
    assert "request access at https://huggingface.co/org/gated" in j.error.message
    assert "sign in" in j.error.message
    first_file = hub.gets("/config.json")[0]
    if token:
        assert header(first_file, "Authorization") == f"Bearer {TOKEN}"  # the token was used...
        assert "not been granted" in j.error.message
    else:
        assert "not signed in" in j.error.message
    for text in (j.error.message, str(j.error), repr(j.error.args), caplog.text):  # ...but never shown
        assert TOKEN not in text


def test_gated_repo_downloads_with_an_allowed_token(hub, tmp_path):
    hub.repos["org/gated"] = make_repo(8, gated=True, allowed_tokens={TOKEN})
    j = run(job(hub, [("org/gated", "main")], tmp_path, token=TOKEN))
    assert j.state == "done", j.error


def test_missing_repo_and_missing_revision(hub, tmp_path):
    hub.repos["org/m"] = make_repo(9)
    j = run(job(hub, [("org/nope", "main")], tmp_path))
    assert j.error.kind == "repo_not_found" and "org/nope" in j.error.message
    j = run(job(hub, [("org/m", "v9.9")], tmp_path))
    assert j.error.kind == "revision_not_found" and "'v9.9'" in j.error.message
    assert not hub.gets(SHARD1)


def test_cancel_mid_file_is_prompt_and_a_later_run_resumes(hub, tmp_path):
    hub.repos["org/m"] = make_repo(10, shards=1, shard_size=400_000)
    shard = "model-00001-of-00001.safetensors"
    size = len(hub.repos["org/m"].files[shard])
    hub.slow_bps = 200_000
    midway = threading.Event()
    j = job(hub, [("org/m", "main")], tmp_path, progress_interval=0,
            on_progress=lambda p: p.current_file == shard and p.bytes_received > 60_000 and midway.set())
    j.start()
    assert midway.wait(WAIT)
    t0 = time.monotonic()
    j.cancel()
    assert j.wait(WAIT)
    assert j.state == "cancelled"
    assert time.monotonic() - t0 < 1.0
    partial = storage_folder(tmp_path, "org/m") / "blobs" / f"{sha(hub.repos['org/m'].files[shard])}.incomplete"
    kept = partial.stat().st_size
    assert 0 < kept < size

    hub.slow_bps = None
    j2 = run(job(hub, [("org/m", "main")], tmp_path))
    assert j2.state == "done", j2.error
    last = hub.gets(shard)[-1]
    assert header(last, "Range") == f"bytes={kept}-"
    assert last["sent"] == size - kept  # a restart would have sent all `size` bytes
    assert j2.progress.bytes_received < size
    assert (j2.result["org/m"] / shard).read_bytes() == hub.repos["org/m"].files[shard]


@pytest.fixture
def no_sockets(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a network connection was attempted in offline mode")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def test_offline_with_full_cache_opens_no_socket(hub, tmp_path, monkeypatch, request):
    hub.repos["org/m"] = make_repo(11)
    online = run(job(hub, [("org/m", "main")], tmp_path))
    assert online.state == "done"
    request.getfixturevalue("no_sockets")
    j = run(job(hub, [("org/m", "main")], tmp_path, offline=True))
    assert j.state == "done", j.error
    assert j.result == online.result
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the standard variable works too
    monkeypatch.setattr(__import__("huggingface_hub").constants, "HF_HUB_OFFLINE", True)
    j = run(job(hub, [("org/m", "main")], tmp_path))
    assert j.state == "done", j.error


def test_offline_with_partial_cache_names_the_missing_files(hub, tmp_path, request):
    hub.repos["org/m"] = make_repo(12)
    online = run(job(hub, [("org/m", "main")], tmp_path))
    (online.result["org/m"] / SHARD1).unlink()
    request.getfixturevalue("no_sockets")
    j = run(job(hub, [("org/m", "main")], tmp_path, offline=True))
    assert j.state == "failed" and j.error.kind == "offline_missing"
    assert SHARD1 in j.error.message and "org/m" in j.error.message
    assert missing_from_cache("org/m", cache_dir=tmp_path)[1] == [SHARD1]
    j = run(job(hub, [("org/never", "main")], tmp_path, offline=True))
    assert j.error.kind == "offline_missing" and "org/never" in j.error.message


def test_the_settings_offline_switch_stops_every_request(hub, tmp_path, request):
    """Settings' Offline switch (what the offline message points to) makes a job use the cache only."""
    from dflash_desktop import downloads
    hub.repos["org/m"] = make_repo(14)
    request.getfixturevalue("no_sockets")
    downloads.set_offline(True)
    try:
        assert downloads.offline_mode()
        j = run(job(hub, [("org/m", "main")], tmp_path))
    finally:
        downloads.set_offline(False)
    assert j.error.kind == "offline_missing" and "Turn off offline mode in Settings" in j.error.message
    assert "revision" not in j.error.message          # "main" is what every download takes: not worth naming


def test_unreachable_hub_reuses_a_complete_cache(hub, tmp_path):
    hub.repos["org/m"] = make_repo(13)
    online = run(job(hub, [("org/m", "main")], tmp_path))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    j = run(DownloadJob([("org/m", "main")], cache_dir=tmp_path, endpoint=dead, token=False))
    assert j.state == "done", j.error
    assert j.result == online.result
    # a repo not on this computer: the message names the unreachable hub, not an offline mode that is off
    j = run(DownloadJob([("org/other", "main")], cache_dir=tmp_path, endpoint=dead, token=False))
    assert j.error.kind == "offline_missing" and j.error.message.startswith(f"The hub at {dead} cannot be reached")
    assert "offline mode" not in j.error.message and "Check the internet connection" in j.error.message


def test_not_enough_disk_space_fails_before_downloading(hub, tmp_path):
    hub.repos["org/m"] = make_repo(14)
    j = run(job(hub, [("org/m", "main")], tmp_path, free_space_fn=lambda path: 50_000_000))
    assert j.state == "failed" and j.error.kind == "disk_full"
    msg = j.error.message
    assert str(tmp_path) in msg and "0.6 MB" in msg and "50.0 MB" in msg and "Free up" in msg
    assert not any("/resolve/" in r["path"] for r in hub.requests)


def test_a_repo_of_pickled_weights_only_is_refused_before_anything_downloads(hub, tmp_path):
    """EAGLE-3 drafters published as pytorch_model.bin (EAGLE's and AngelSlim's trainers save them so): the pair's
    download fails at once naming the file and why, before its target's bytes are fetched."""
    hub.repos["org/target"] = make_repo(1)
    drafter = make_repo(2, extra={"pytorch_model.bin": b"pickle" * 100})
    drafter.files = {k: v for k, v in drafter.files.items() if "safetensors" not in k}
    hub.repos["org/draft"] = drafter
    j = run(job(hub, [("org/target", "main"), ("org/draft", "main")], tmp_path / "cache"))
    assert j.state == "failed" and j.error.kind == "pickled_weights" and j.error.repo_id == "org/draft"
    assert "org/draft publishes its weights only as pickled PyTorch files (pytorch_model.bin)" in j.error.message
    assert "Nothing was downloaded" in j.error.message
    assert not any("/resolve/" in r["path"] for r in hub.requests)


def test_the_fake_hub_is_faithful_enough_for_huggingface_hub_itself(hub, tmp_path):
    """If huggingface_hub's own snapshot_download works against the fake, the fake speaks the hub's protocol."""
    from huggingface_hub import snapshot_download

    hub.repos["org/m"] = make_repo(15)
    folder = snapshot_download("org/m", cache_dir=tmp_path, endpoint=hub.url, token=False,
                               allow_patterns=["*.safetensors", "*.json"])
    assert (Path(folder) / SHARD1).read_bytes() == hub.repos["org/m"].files[SHARD1]
    assert any(r["method"] == "HEAD" for r in hub.requests)


def test_allow_and_ignore_patterns():
    for ok in ("model.safetensors", "sub/model-00001-of-00002.safetensors", "config.json", "tokenizer.json",
               "tokenizer.model", "merges.txt", "chat_template.jinja", "generation_config.json"):
        assert wanted(ok), ok
    for bad in ("pytorch_model.bin", "model.pt", "x.pkl", "original/params.json", "model.gguf", "dflash.py",
                "README.md", "metal/model.bin"):
        assert not wanted(bad), bad


# ----------------------------------------------------------------------------- hostile hubs and caches
# Paths below are relative to snapshots/<commit>/ (files), blobs/ (oids) or refs/ and trees/ (revisions,
# shas): three or four '..' climb out of the cache folder (tmp_path/cache) into tmp_path/user.

def user_files(tmp_path) -> Path:
    """A user's folder beside the cache, with files a hostile listing aims at."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "tokenizer.json").write_bytes(b"the user's own tokenizer\n")
    (user / "config.json").write_bytes(b"the user's own config\n")
    (user / "notes.incomplete").write_bytes(b"my notes\n")
    return user


def outside(tmp_path, cache) -> dict:
    """Everything under tmp_path but outside the cache (type and bytes): a download must change none of it."""
    found = {}
    for folder, dirs, files in os.walk(tmp_path):
        dirs[:] = [d for d in dirs if Path(folder, d) != cache]
        for name in dirs + files:
            p = Path(folder, name)
            found[str(p)] = ("link", os.readlink(p)) if p.is_symlink() else \
                ("dir",) if p.is_dir() else ("file", p.read_bytes())
    return found


def refused(j: DownloadJob, kind: str, *words: str) -> None:
    assert j.state == "failed" and j.error is not None, f"the download was not refused (state {j.state})"
    assert j.error.kind == kind, j.error.message
    for word in words:
        assert word in j.error.message, j.error.message


HOSTILE_PATHS = {
    "dotdot": lambda tmp: "../../../../user/autostart/tokenizer.json",
    "absolute": lambda tmp: str(tmp / "user" / "autostart" / "tokenizer.json"),
    "backslash": lambda tmp: "..\\..\\..\\..\\user\\autostart\\tokenizer.json",
    "drive_letter": lambda tmp: "C:tokenizer.json",
}


@pytest.mark.parametrize("case", HOSTILE_PATHS)
def test_listed_path_that_leaves_the_snapshot_is_refused_and_nothing_outside_changes(hub, tmp_path, case):
    """A listing names a tokenizer file (matched by 'tokenizer*') in an autostart folder outside the cache.
    Without the check the downloader fetched it and created that folder and a link there (backslash and
    drive letter paths do that on Windows only, but are refused everywhere)."""
    user_files(tmp_path)
    cache = tmp_path / "cache"
    hostile = HOSTILE_PATHS[case](tmp_path)
    repo = hub.repos["org/m"] = make_repo(20, extra={hostile: b'{"evil": true}'})
    hub.static["/user/autostart/tokenizer.json"] = repo.files[hostile]  # where httpx asks, '..' segments dropped
    before = outside(tmp_path, cache)
    j = run(job(hub, [("org/m", "main")], cache))
    refused(j, "unsafe_name", "org/m", repr(hostile), "another mirror")
    assert outside(tmp_path, cache) == before
    assert not any("/resolve/" in r["path"] for r in hub.requests)  # refused before any file was fetched


def test_commit_sha_with_a_traversal_is_refused_and_nothing_outside_changes(hub, tmp_path):
    """The sha names trees/<sha>.json and snapshots/<sha>/: without the check both landed in tmp_path/user."""
    user_files(tmp_path)
    cache = tmp_path / "cache"
    evil = "../../../user/snap"
    hub.repos["org/m"] = make_repo(21, shards=1)
    hub.repos["org/m"].commits = {"main": evil, evil: evil}
    before = outside(tmp_path, cache)
    j = run(job(hub, [("org/m", "main")], cache))
    refused(j, "unsafe_name", "the commit sha", repr(evil), "40 hex digits")
    assert outside(tmp_path, cache) == before


def test_revision_with_a_traversal_is_refused_and_nothing_outside_changes(hub, tmp_path):
    """A catalog revision names refs/<revision>: without the check the commit was written to tmp_path/user/x."""
    user_files(tmp_path)
    cache = tmp_path / "cache"
    evil = "../../../user/x"
    hub.repos["org/m"] = make_repo(22, shards=1)
    hub.repos["org/m"].commits[evil] = hub.repos["org/m"].commits["main"]
    before = outside(tmp_path, cache)
    j = run(job(hub, [("org/m", evil)], cache))
    refused(j, "unsafe_name", "the revision", "'..' part", "catalog")
    assert outside(tmp_path, cache) == before


@pytest.mark.parametrize("listed", [SHARD1, "config.json"], ids=["lfs_sha256", "git_oid"])
def test_oid_with_a_traversal_is_refused_and_the_users_file_is_not_appended_to_or_deleted(hub, tmp_path, listed):
    """The oid names blobs/<oid>.incomplete: without the check the download resumed into the user's
    notes.incomplete (appending to it), failed its checksum and deleted it."""
    user = user_files(tmp_path)
    cache = tmp_path / "cache"
    hub.repos["org/m"] = make_repo(23)
    hub.repos["org/m"].listed_oids[listed] = "../../../user/notes"
    before = outside(tmp_path, cache)
    j = run(job(hub, [("org/m", "main")], cache))
    refused(j, "unsafe_name", listed, "'../../../user/notes'", "hex digits")
    assert (user / "notes.incomplete").read_bytes() == b"my notes\n"
    assert outside(tmp_path, cache) == before



@pytest.mark.parametrize("planted", ["blobs_folder", "partial_file", "snapshot_folder"])
def test_symlink_in_the_cache_that_leads_outside_is_never_written_through(hub, tmp_path, planted):
    """A link planted in the cache (by another tool or a shared folder) points at the user's folder.
    Without the check the download wrote its partial file there, resumed into the user's notes (appending
    to them), or deleted the user's config.json to put a snapshot link in its place."""
    user = user_files(tmp_path)
    cache = tmp_path / "cache"
    repo = hub.repos["org/m"] = make_repo(24)
    storage = storage_folder(cache, "org/m")
    link = {"blobs_folder": storage / "blobs",
            "partial_file": storage / "blobs" / f"{sha(repo.files[SHARD1])}.incomplete",
            "snapshot_folder": storage / "snapshots" / repo.commits["main"]}[planted]
    link.parent.mkdir(parents=True)
    link.symlink_to(user / "notes.incomplete" if planted == "partial_file" else user)
    before = outside(tmp_path, cache)
    j = run(job(hub, [("org/m", "main")], cache))
    refused(j, "unsafe_cache", str(link), str(user), "Delete that link")
    assert outside(tmp_path, cache) == before


def test_path_and_hex_rules():
    from dflash_desktop.downloads import UnsafeName, require_hex, safe_relpath

    for ok in ("config.json", "sub/dir/model.safetensors", "refs/pr/1", "v1.0", "..hidden", "a..b"):
        assert safe_relpath(ok) == ok
    for bad, why in (("", "empty"), ("a//b", "empty part"), ("a/", "empty part"), ("/etc/x", "absolute"),
                     ("a/../b", "'..'"), ("./a", "'.'"), ("a\\b", "backslash"), ("C:x", "drive letter"),
                     ("D:/x", "drive letter"), ("a\0b", "NUL"), (None, "not text")):
        with pytest.raises(UnsafeName, match=why):
            safe_relpath(bad)
    assert require_hex("a" * 40, 40, "sha") == "a" * 40
    for bad in ("A" * 40, "a" * 39, "a" * 40 + "\n", "../" + "a" * 37, None, "g" * 40):
        with pytest.raises(UnsafeName, match="not 40 hex digits"):
            require_hex(bad, 40, "sha")
