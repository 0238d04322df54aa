"""Settings: defaults, validation messages that name the field, atomic save/load, and a damaged file
that falls back field by field instead of stopping the app."""
from __future__ import annotations

import json
import os
import re
import threading

import pytest

from dflash_desktop import settings as S
from tests.ui_fixtures import run_app_briefly
from dflash_desktop.session import BaselineRecord, diagnose, request_for, speedup, title_from


@pytest.mark.parametrize("field,value,message", [
    ("temperature", 50.0, "Temperature must be 0 (greedy) or from 0.01 to 2"),
    ("temperature", -1, "Temperature"),
    ("temperature", 1e-40, "Temperature must be 0 (greedy) or from 0.01"),
    ("top_p", 0.0, "Top-p must be above 0 and at most 1"),
    ("top_p", 1.5, "Top-p"),
    ("top_k", -3, "Top-k must be 0 (off) or from 1 to 100000"),
    ("top_k", 2.5, "Top-k must be a whole number"),
    ("max_new_tokens", 0, "Max new tokens must be from 1 to 32768"),
    ("max_new_tokens", 10**6, "Max new tokens"),
    ("max_new_tokens", True, "Max new tokens must be a number"),
    ("plain_fallback", "yes", "Plain fallback"),
    ("block_size", 17, "Block size must be between 1 and 16"),
    ("draft_cutoff", 1.0, "Draft cutoff must be at least 0 and below 1"),
    ("draft_cutoff", "high", "Draft cutoff"),
    ("theme", "neon", "Theme must be one of system, light, dark"),
    ("font_size", 2, "Font size must be between 7 and 32"),
    ("font_size", True, "Font size"),
    ("show_stats", "yes", "Show stats is on or off"),
    ("highlight_drafted", 1, "Highlight drafted is on or off"),
    ("last_pair", [1], "The last model pair"),
    ("last_pair", {"id": "demo", "target_dir": 5}, "The last model pair"),
    ("last_pair", {"id": "demo", "target_dir": "/x", "plan": {"engine": "torch", "device": "cpu", "x": 1}},
     "The last model pair"),
    ("last_pair", {"id": "s", "remote": True}, "The last model pair"),
    ("last_pair", {"id": "s", "remote": {"base_url": "http://h", "api_key": "k", "token": "t"}}, "The last model pair"),
    ("baselines", {"demo|/x": {"tok_s": "fast", "tokens": 64, "measured_at": 1.0, "device": "cpu"}}, "Baselines"),
    ("baselines", {"demo|/x": {"tok_s": 40.0, "tokens": 64, "measured_at": 1e300, "device": "cpu"}}, "Baselines"),
    ("baselines", [], "Baselines"),
    ("baselines", {"demo|/x": {"tok_s": 40.0, "tokens": 64, "measured_at": 1.0, "device": "cpu", "runs": ["x"]}},
     "Baselines"),
    ("engine", ["torch"], "Engine must be"),
    ("measured", {"demo": {"method": "warp", "summary": "x"}}, "Measured methods are {method, summary, engine} per model"),
    ("measured", {"demo": {"method": "none", "summary": "x", "engine": "vllm"}}, "Measured methods"),
    ("measured", {"demo": {"method": "ngram"}}, "Measured methods"),
    ("measured", {str(i): {"method": "none", "summary": ""} for i in range(S.MAX_MEASURED + 1)}, "Measured methods"),
])
def test_absurd_values_are_refused_with_a_clear_message(field, value, message):
    s = S.Settings(**{field: value})
    with pytest.raises(S.SettingsError, match=re.escape(message)):
        s.validate(max_block_size=16)


def test_the_measured_method_of_each_pair_is_kept_the_latest_last():
    s = S.Settings()
    for i in range(S.MAX_MEASURED + 2):
        S.remember_measured(s, f"pair{i}", "ngram", f"n-gram lookup, run {i}")
    S.remember_measured(s, "pair5", "dflash", "DFlash, 7 drafts a step")
    assert len(s.measured) == S.MAX_MEASURED and list(s.measured)[-1] == "pair5" and "pair0" not in s.measured
    assert s.measured["pair5"] == {"method": "dflash", "summary": "DFlash, 7 drafts a step"}
    s.validate(max_block_size=16)


def test_defaults_are_valid_and_generation_dict():
    s = S.Settings().validate(16)
    assert s.generation(16) == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 256,
                                "min_p": 0.05, "repeat_penalty": 1.1, "loop_guard": 64, "plain_fallback": True}
    assert S.Settings(block_size=12).generation(8)["block_size"] == 8
    assert S.Settings(draft_cutoff=0.0).generation(16)["draft_cutoff"] == 0.0   # None (automatic) is left out


def test_save_load_round_trip_and_damaged_files(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    s = S.Settings(temperature=0.7, theme="dark", last_pair={"id": "demo", "target_dir": "/x"},
                   baselines={"demo|/x": {"tok_s": 40.0, "tokens": 64, "measured_at": 1.0, "device": "cpu"}})
    S.save(s)
    assert S.load() == s
    path = tmp_path / "config" / "settings.json"
    raw = json.loads(path.read_text())
    raw.update(temperature=99, font_size="big", unknown_key=1)
    path.write_text(json.dumps(raw))
    loaded = S.load()
    assert loaded.temperature == 0.0 and loaded.font_size == 11 and loaded.theme == "dark"  # bad fields only
    path.write_text("{not json")
    assert S.load() == S.Settings()


def test_baseline_record_speedup_and_diagnosis():
    rec = BaselineRecord(tok_s=40.0, tokens=64, measured_at=__import__("time").time(), device="cpu")
    text = rec.describe()
    assert text.startswith("Baseline 40 tok/s — plain decoding of the same target, measured today")
    assert "on this CPU, 64 tokens (calibration run)." in text
    assert BaselineRecord.from_dict(rec.to_dict()) == rec and BaselineRecord.from_dict({"tok_s": 1}) is None
    good = {"generated_tokens": 64, "tau": 4.0, "decode_tok_s": 120.0}
    assert speedup(good, rec) == 3.0 and diagnose(good, rec) is None
    assert "Low acceptance" in diagnose({**good, "tau": 1.1}, rec)
    assert "slower than plain decoding" in diagnose({**good, "decode_tok_s": 30.0}, rec)
    assert "No drafter" in diagnose(good, rec, has_drafter=False)
    assert diagnose({"generated_tokens": 2, "tau": 1.0}, rec) is None   # too little to judge


def test_request_for_chat_and_raw_models():
    history = [{"role": "user", "content": "def f("}, {"role": "assistant", "content": "x):"},
               {"role": "user", "content": "\n"}]
    assert request_for(history, "sys", True) == {"messages": [{"role": "system", "content": "sys"}, *history]}
    assert request_for(history, "", True) == {"messages": history}
    assert request_for(history, "", False) == {"prompt": "def f(x):\n"}
    assert request_for(history, "You are helpful.", False) == {"prompt": "def f(x):\n"}   # no roles, no system
    assert title_from("  a   long\ntitle ") == "a long title" and len(title_from("x" * 100)) == 48


def test_the_diagnosis_gives_the_fallbacks_reason_and_the_switch():
    stats = {"generated_tokens": 90, "tau": 1.1, "decode_tok_s": 50.0,
             "fallback": {"reason": "DFlash committed 1.10 tokens per step over its first 32 steps, below ..."}}
    text = diagnose(stats, None)
    assert text.startswith("DFlash committed 1.10 tokens per step") and "Plain fallback" in text


def test_pairs_the_window_saves_are_valid():
    for pair in ({"id": "demo", "name": "Demo", "target_dir": "/t", "draft_dir": None,
                  "plan": {"engine": "torch", "device": "cpu", "dtype": None}, "planned": None, "thinking": False},
                 {"id": "local:/t", "name": "t", "target_dir": "/t", "draft_dir": "/d",
                  "plan": {"engine": "auto", "device": "auto", "dtype": None}, "thinking": None},
                 {"id": "remote:http://h/v1", "name": "Server at h",
                  "remote": {"base_url": "http://h/v1", "api_key": ""}}):
        assert S.Settings(last_pair=pair).validate().last_pair == pair


def write_settings(tmp_path, monkeypatch, text: str):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    path = tmp_path / "config" / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_wrong_types_fall_back_to_defaults_with_a_notice_naming_each_field(tmp_path, monkeypatch):
    nested: list = []
    for _ in range(500):
        nested = [nested]
    write_settings(tmp_path, monkeypatch, json.dumps({
        "theme": "dark", "show_stats": "yes", "highlight_drafted": "x", "last_pair": [1],
        "baselines": {"k": {"tok_s": 1e400}}, "remote_servers": nested}))
    settings, notice = S.load_checked()
    assert settings.theme == "dark"                                   # the good field is kept
    assert (settings.show_stats, settings.highlight_drafted, settings.last_pair, settings.baselines,
            settings.remote_servers) == (True, True, None, {}, [])
    for name in ("show_stats", "highlight_drafted", "last_pair", "baselines", "remote_servers"):
        assert f"- {name}: " in notice
    assert "theme" not in notice and "back to their defaults" in notice


@pytest.mark.parametrize("text, problem", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"last_pair": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ("[1, 2]", "does not hold a JSON object"),
    ("{not json", "could not be read"),
], ids=["deep", "deep-field", "list", "not-json"])
def test_an_unreadable_file_gives_the_defaults_with_a_notice(tmp_path, monkeypatch, text, problem):
    path = write_settings(tmp_path, monkeypatch, text)
    settings, notice = S.load_checked()
    assert settings == S.Settings() and problem in notice and str(path) in notice


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and /dev/zero are POSIX")
@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link"])
def test_a_settings_file_that_is_not_a_file_is_not_read(tmp_path, monkeypatch, kind):
    path = write_settings(tmp_path, monkeypatch, "{}")
    path.unlink()
    os.mkfifo(path) if kind == "fifo" else path.symlink_to("/dev/zero")
    result = {}
    thread = threading.Thread(target=lambda: result.update(loaded=S.load_checked()), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "reading the settings blocked"
    settings, notice = result["loaded"]
    assert settings == S.Settings() and "not a regular file" in notice


def test_the_app_starts_with_every_wrong_field(tmp_path, monkeypatch):
    """`python -m dflash_desktop` with fields of the wrong type: it used to exit 1 with a traceback, every time."""
    write_settings(tmp_path, monkeypatch, json.dumps({
        "show_stats": "yes", "highlight_drafted": "no", "last_pair": {"id": "x", "remote": True},
        "baselines": {"demo|x": {"tok_s": 1, "tokens": 1e300, "measured_at": 1, "device": "cpu"}},
        "window_state": {"x": 1}, "last_conversation": "1"}))
    out = run_app_briefly(tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert S.load_checked()[1] is None          # written again at quit: the next start has nothing to say
