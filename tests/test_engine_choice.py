"""The engine-choice policy's rule for a load that replaces a loaded pair (engine/backends/choice.py): the old
pair stays while the new one loads only when both fit in the computer's memory; the worker's side of it (a
failed load leaves the old pair answering) is in tests/test_worker.py."""
from __future__ import annotations

from engine.backends.choice import LOAD_GROWTH, KEEP_SHARE, keeps_loaded_pair

MB = 2**20


def make_model(folder, megabytes: int):
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * (megabytes * MB))
    return folder


def test_a_cpu_pair_stays_while_a_new_one_loads_only_when_both_fit(tmp_path):
    target = make_model(tmp_path / "target", 4)
    cpu = {"device": "cpu", "engine": "torch"}
    fits = int(LOAD_GROWTH["default"] * 5 * MB / KEEP_SHARE)          # room for 5 MB of files, 4 given
    assert keeps_loaded_pair(cpu, "torch", target, available=fits)
    assert not keeps_loaded_pair(cpu, "torch", target, available=fits // 2)
    draft = make_model(tmp_path / "draft", 2)                         # the drafter counts too: 6 MB
    assert not keeps_loaded_pair(cpu, "torch", target, draft, available=fits)


def test_nothing_is_kept_without_a_pair_or_for_a_pair_on_a_gpu(tmp_path):
    target = make_model(tmp_path / "target", 1)
    plenty = 1 << 40
    assert not keeps_loaded_pair(None, "torch", target, available=plenty)
    for device in ("cuda:0", "mps", "gpu"):
        assert not keeps_loaded_pair({"device": device}, "torch", target, available=plenty)


def test_a_gguf_that_torch_unpacks_needs_more_room_than_llama_cpp_maps(tmp_path):
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * (4 * MB))
    room = int(LOAD_GROWTH["llamacpp"] * 5 * MB / KEEP_SHARE)
    assert keeps_loaded_pair({"device": "cpu"}, "llamacpp", gguf, available=room)
    assert not keeps_loaded_pair({"device": "cpu"}, "torch", gguf, available=room)
