"""What the window loads and what loaded, as types (dflash_desktop/pairs.py): a stored pair comes back the same,
a malformed one is refused before it reaches the worker, and the loaded event is read once."""
from __future__ import annotations

import pytest

from dflash_desktop.offers import REMOTE
from dflash_desktop.pairs import LoadedPair, PairRequest


def test_a_request_round_trips_through_the_settings_and_keys_its_baseline():
    pair = PairRequest("demo", "Demo pair", "/m/target", "/m/draft",
                       plan={"engine": "torch", "device": "cpu", "dtype": None}, thinking=False)
    stored = pair.to_dict()
    assert stored == {"id": "demo", "name": "Demo pair", "target_dir": "/m/target", "draft_dir": "/m/draft",
                      "plan": {"engine": "torch", "device": "cpu", "dtype": None}, "thinking": False}
    assert PairRequest.of(stored) == pair and PairRequest.of(pair) is pair
    assert pair.key == "demo|/m/target"
    assert pair.with_plan(engine="llamacpp").plan == {"engine": "llamacpp", "device": "cpu", "dtype": None}
    assert PairRequest("x", "X", "/t").run_plan == {"engine": "auto", "device": "auto", "dtype": None}
    server = PairRequest.of({"id": "remote:http://h", "name": "", "remote": {"base_url": "http://h"}})
    assert server.key == "remote:http://h|" and server.named("Qwen").name == "Qwen"


@pytest.mark.parametrize("bad", [
    {"id": "demo", "target_dir": 5},
    {"id": "demo", "target_dir": "/x", "plan": {"engine": "warp", "device": "cpu"}},
    {"id": "demo", "target_dir": "/x", "colour": "red"},
    {"id": "s", "remote": {"base_url": "http://h", "token": "t"}},
    {"name": "no id", "target_dir": "/x"},
    [1],
])
def test_a_malformed_request_is_refused_with_the_shapes_it_takes(bad):
    with pytest.raises(ValueError, match=r"not a model pair this version can load: \{id, name, target_dir"):
        PairRequest.of(bad)


def test_the_loaded_event_is_read_once_with_what_the_window_asks():
    event = {"event": "loaded", "id": "app-load_pair-1", "name": "SmolLM2", "engine": "llamacpp", "device": "cpu",
             "dtype": "q4_1", "block_size": 16, "has_drafter": True, "chat_template": "{% for m in messages %}",
             "max_positions": 8192, "load_s": 1.5, "speculation": {"n_max": 0, "reason": "plain was faster"},
             "architecture": "llama"}
    loaded = LoadedPair.of(event)
    assert (loaded.name, loaded.engine, loaded.device, loaded.dtype, loaded.block_size) == \
        ("SmolLM2", "llamacpp", "cpu", "q4_1", 16)
    assert loaded.has_drafter and loaded.chat_template is True and loaded.max_positions == 8192
    assert loaded.offers.local and loaded.offers.baseline and loaded.speculation["reason"] == "plain was faster"
    assert loaded.event["architecture"] == "llama"        # the rest stays readable, never retyped
    remote = LoadedPair.of({"name": "Qwen", "device": "server", "engine": "remote", "offers": REMOTE.to_dict()})
    assert remote.offers == REMOTE and not remote.chat_template and remote.max_positions == 0


def test_what_the_engine_measured_fastest_is_said_in_words():
    """The model list keeps this line per pair: the method, its drafts a step, and the calibration's reason; an
    engine that measured nothing (a torch pair, a server) says nothing."""
    reason = "llama.cpp's n-gram lookup with 8 drafts per step decoded 98 tokens/s ... Measured beside it: DFlash 34."
    ngram = LoadedPair.of({"name": "q", "device": "cpu", "has_drafter": True, "method": "ngram",
                           "speculation": {"method": "ngram", "n_max": 8, "reason": reason}})
    assert ngram.measured == f"n-gram lookup, 8 drafts a step. {reason}"
    plain = LoadedPair.of({"name": "q", "device": "cpu", "method": "none",
                           "speculation": {"method": "none", "n_max": 0, "reason": "Plain was fastest."}})
    assert plain.measured == "plain decoding. Plain was fastest."
    assert LoadedPair.of({"name": "q", "device": "cpu", "has_drafter": True}).measured is None
