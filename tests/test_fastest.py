"""The engines that run a pair on this computer, timed against each other at its first load (engine/fastest.py):
real engines on the demo pair, a real worker and the real window."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from engine import fastest
from engine.backends import ENGINES, load_pair, missing_engines
from engine.bench import DEMO_DIR
from engine.errors import Cancelled
from engine.worker import _close
from tests.ui_chat_fixtures import LOAD_TIMEOUT_MS, chat_worker, home, make_window  # noqa: F401

TARGET, DRAFT = DEMO_DIR / "target", DEMO_DIR / "draft"


def cand(engine: str, device: str = "cpu", dtype: str | None = None) -> fastest.Candidate:
    return fastest.Candidate(engine, device, dtype)


def built(*names: str) -> list[str]:
    return [n for n in names if n not in missing_engines()]


def test_the_candidates_are_the_engines_here_that_run_the_same_files_on_the_same_device(tmp_path):
    cands = fastest.candidates(cand("llamacpp"), "cpu", TARGET, DRAFT)
    assert [c.engine for c in cands] == ["llamacpp", *built("torch", "mlx")]
    assert {(c.device, c.dtype) for c in cands[1:]} == {("cpu", "float32")}
    # a drafter that reads the target's last layer: llama.cpp's graph cannot hand it over, so it is no candidate
    draft = tmp_path / "draft"
    shutil.copytree(DRAFT, draft)
    raw = json.loads((draft / "config.json").read_text())
    layers = json.loads((TARGET / "config.json").read_text())["num_hidden_layers"]
    raw["dflash_config"]["target_layer_ids"][-1] = layers - 1
    (draft / "config.json").write_text(json.dumps(raw))
    assert [c.engine for c in fastest.candidates(cand("torch"), "cpu", TARGET, draft)] == ["torch", *built("mlx")]
    # an NVIDIA GPU: torch's CUDA path, and llama.cpp through its Vulkan build (built here for lavapipe)
    on_gpu = fastest.candidates(cand("torch", "cuda", "bfloat16"), "cuda", TARGET, DRAFT)
    from engine.backends.llamacpp import build
    assert [(c.engine, c.device) for c in on_gpu] == [("torch", "cuda")] + (
        [("llamacpp", "vulkan")] if "vulkan" in build.builds() else [])


def test_a_measurement_is_remembered_for_the_same_files_and_engines_only(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    draft = tmp_path / "draft"
    shutil.copytree(DRAFT, draft)
    cands = [cand("llamacpp"), cand("torch", dtype="float32")]
    assert fastest.remembered(cands, TARGET, draft) is None
    fastest.remember(cands, TARGET, draft, {"engine": "torch", "device": "cpu", "dtype": "float32", "reason": "x"})
    assert fastest.remembered(cands, TARGET, draft)["engine"] == "torch"
    assert fastest.remembered(cands[::-1], TARGET, draft)["engine"] == "torch"      # the planned one first or not
    assert fastest.remembered(cands[:1] + [cand("mlx")], TARGET, draft) is None      # other engines: measured again
    st = (draft / "config.json").stat()
    os.utime(draft / "config.json", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))    # a changed drafter, too
    assert fastest.remembered(cands, TARGET, draft) is None


def demo(c: fastest.Candidate):
    return load_pair(c.engine, TARGET, DRAFT, device=c.device, dtype=c.dtype)


def recording_close(closed: list):
    """The worker's own close, each pair it closes recorded."""
    def close(pair):
        closed.append(pair)
        _close(pair)
    return close


def test_the_engines_take_turns_and_the_fastest_stays_loaded(unmeasured):
    first = demo(cand("llamacpp"))
    closed, messages = [], []
    pair, chosen, result = fastest.compare(first, [cand("llamacpp"), cand("torch")], demo, recording_close(closed),
                                           together=True, progress=messages.append)
    try:
        timed = {n: r["tok_s"] for n, r in result["rates"].items() if not r.get("first_answer_only")}
        assert set(result["rates"]) == {"llamacpp", "torch"} and min(r["tok_s"] for r in result["rates"].values()) > 0
        winner = max(timed, key=timed.get)
        assert chosen.engine == result["engine"] == winner == pair.info["engine"]
        assert [p.info["engine"] for p in closed] == [n for n in ("llamacpp", "torch") if n != winner]
        assert result["reason"].startswith(f"{ENGINES[winner].label} decoded {timed[winner]:.0f} tokens/s")
        assert result["prompts"] == 6 and result["device_class"] == "cpu" and not result["failed"]
        # turn about: round 1 times each prompt on both engines before the next prompt
        order = [m for m in messages if "round 1 of 2" in m]
        if len(timed) == 2:
            assert [("llama.cpp" in m, "prompt 1" in m) for m in order[:2]] == [(True, True), (False, True)]
        if winner == "llamacpp":
            assert first.server is not None       # kept: the planned engine's pair, loaded once
    finally:
        _close(pair)


def test_an_engine_that_cannot_load_is_left_out_and_the_winner_loads_again(unmeasured):
    """Each engine alone (a GPU holds one model at a time): the planned engine is timed and closed, PyTorch
    cannot load the pair on CUDA here, so llama.cpp is loaded again and its reason names the failure."""
    first = demo(cand("llamacpp"))
    pair, chosen, result = fastest.compare(first, [cand("llamacpp"), cand("torch", "cuda")], demo, _close,
                                           together=False)
    try:
        assert chosen.engine == "llamacpp" and pair is not first and first.server is None and pair.server is not None
        assert set(result["failed"]) == {"torch"} and "CUDA" in result["failed"]["torch"]
        assert "PyTorch could not run it here" in result["reason"]
        assert list(result["rates"]) == ["llamacpp"]
    finally:
        _close(pair)


def test_a_cancel_while_timing_stops_the_load_and_closes_every_engine(unmeasured):
    first = demo(cand("llamacpp"))
    closed, messages = [], []
    with pytest.raises(Cancelled, match="comparing the engines"):
        fastest.compare(first, [cand("llamacpp"), cand("torch")], demo, recording_close(closed), together=True,
                        progress=messages.append, cancelled=lambda: any("timing" in m for m in messages))
    assert sorted(p.info["engine"] for p in closed) == ["llamacpp", "torch"] and first.server is None


def test_a_slow_engine_has_its_answers_cut_short_and_is_timed_one_round_only(unmeasured, smollm2_gguf,
                                                                              smollm2_folder, monkeypatch):
    """SmolLM2's chat pair: MLX on this CPU decodes it dozens of times slower than llama.cpp (docs/BENCHMARKS.md).
    Let past the warm-up (WARM_SHARE 0), each timed MLX answer stops once it is slower than half llama.cpp's speed,
    so a slow engine costs a first load seconds, not minutes; it is not timed in round 2 and llama.cpp wins."""
    if "mlx" in missing_engines():
        pytest.skip("mlx is not installed here")
    from engine.chat_pair import DRAFT_DIR
    monkeypatch.setattr(fastest, "WARM_SHARE", 0.0)
    answers, real_answer = [], fastest._answer
    monkeypatch.setattr(fastest, "_answer", lambda pair, *a: answers.append(
        (pair.info["engine"], a[3], real_answer(pair, *a))) or answers[-1][2])   # the real answer, recorded
    files = {"llamacpp": smollm2_gguf, "mlx": smollm2_folder}

    def load(c):
        return load_pair(c.engine, files[c.engine], DRAFT_DIR, device=c.device, dtype=c.dtype)
    cands = [cand("llamacpp"), cand("mlx")]
    messages = []
    pair, chosen, result = fastest.compare(load(cands[0]), cands, load, _close, together=True,
                                           progress=messages.append)
    _close(pair)
    timed = [(name, limit, run) for name, limit, run in answers if limit != fastest.WARM_LIMIT_S]
    slow = [run for name, _, run in timed if name == "mlx"]
    assert len(slow) == 3 and all(run["cut"] and run["tokens"] < result["tokens"] - 1 for run in slow), slow
    assert not any(run["cut"] for name, _, run in timed if name == "llamacpp")
    assert not any("timing MLX (round 2" in m for m in messages)
    assert chosen.engine == result["engine"] == "llamacpp"
    assert result["rates"]["mlx"]["tok_s"] < fastest.KEEP_SHARE * result["rates"]["llamacpp"]["tok_s"]


def test_the_window_times_the_engines_at_a_first_load_and_remembers_the_winner(qtbot, home, chat_worker):
    """The model picker planned PyTorch for the demo pair: the real worker times every engine here that runs it,
    loads the fastest, and says why in the stats panel and the model list; the next load of the pair goes
    straight to that engine. A plan the user chose in the settings is loaded as it is."""
    from dflash_desktop import settings as settings_mod
    from dflash_desktop.pairs import PairRequest
    plan = {"engine": "torch", "device": "cpu", "dtype": None}
    pair = {"id": "demo-race", "name": "Demo", "target_dir": str(TARGET), "draft_dir": str(DRAFT), "plan": plan,
            "planned": plan}
    settings = settings_mod.Settings(max_new_tokens=24)
    window = make_window(qtbot, chat_worker, pair, settings=settings, wait_ready=False)
    said = []
    window.session.loadingChanged.connect(lambda busy, text: said.append(text))
    qtbot.waitUntil(lambda: window.session.ready, timeout=4 * LOAD_TIMEOUT_MS)
    loaded = window.session.loaded
    choice = loaded.engine_choice
    timed = {n: r["tok_s"] for n, r in choice["rates"].items() if not r.get("first_answer_only")}
    assert set(choice["rates"]) == {"torch", *built("llamacpp", "mlx")}
    assert loaded.engine == choice["engine"] == max(timed, key=timed.get)
    assert any("Comparing engines on this computer: timing" in text for text in said)
    assert choice["reason"] in window.stats_panel.runtime.text()
    if loaded.engine != "torch":
        assert choice["reason"].endswith("rather than PyTorch.")
    record = window.settings.measured[PairRequest.of(pair).measured_key]
    assert record["engine"] == loaded.engine and choice["summary"] in record["summary"]

    said.clear()
    window.session.unload()
    qtbot.waitUntil(lambda: window.session.loaded is None, timeout=LOAD_TIMEOUT_MS)
    window.session.reload()
    qtbot.waitUntil(lambda: window.session.ready, timeout=LOAD_TIMEOUT_MS)
    assert window.session.loaded.engine == loaded.engine and window.session.loaded.engine_choice == choice
    assert not any("Comparing engines" in text for text in said)

    window.settings.engine = "torch"                  # the user's own engine: loaded as asked, nothing compared
    assert not window.session.planned_by_app(PairRequest.of(pair))
    window.load_pair(window.with_engine(PairRequest.of(pair)))
    qtbot.waitUntil(lambda: window.session.ready and window.session.loaded.engine == "torch",
                    timeout=LOAD_TIMEOUT_MS)
    assert window.session.loaded.engine_choice is None


def test_only_the_apps_own_plan_is_compared(tmp_path):
    from dflash_desktop import settings as settings_mod
    from dflash_desktop.pairs import PairRequest
    from ui.pair_session import PairSession
    planned = {"engine": "llamacpp", "device": "cpu", "dtype": None}
    session = PairSession.__new__(PairSession)
    session.settings = settings_mod.Settings()
    picked = PairRequest(id="p", name="P", target_dir="t", plan=planned, planned=planned)
    assert session.planned_by_app(picked) and session.planned_by_app(PairRequest(id="p", name="P", target_dir="t"))
    assert session.planned_by_app(picked.with_plan(engine="auto", device="auto"))
    assert not session.planned_by_app(picked.with_plan(engine="torch", device="auto", dtype=None))   # a way out
    session.settings.engine = "llamacpp"
    assert not session.planned_by_app(picked)


def test_the_model_list_says_which_engine_a_first_load_measured_fastest():
    from dflash_desktop.run_plan import runs_line
    assert runs_line("llama.cpp on the CPU, float32", "llamacpp", None) == "Runs with llama.cpp on the CPU, float32\n"
    assert runs_line("llama.cpp on the CPU, float32", "llamacpp", "llamacpp").endswith("· measured fastest here\n")
    assert runs_line("llama.cpp on the CPU, float32", "llamacpp", "torch") == (
        "Runs with PyTorch: measured faster here than llama.cpp on the CPU, float32\n")
    assert runs_line("", "torch", "torch") == ""


def test_a_remembered_winner_that_no_longer_loads_gives_way_to_the_plan_and_is_measured_again(tmp_path, monkeypatch):
    """The real worker: the measurement named MLX on Apple's GPU (the install changed since), which cannot load
    here; the planned PyTorch runs the pair, the answer says why, and the record is gone."""
    from dflash_desktop.worker_client import WorkerClient
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    if "mlx" in missing_engines():
        pytest.skip("mlx is not installed here")
    cands = fastest.candidates(cand("torch"), "cpu", TARGET, DRAFT)
    fastest.remember(cands, TARGET, DRAFT, {"engine": "mlx", "device": "gpu", "dtype": None, "reason": "timed"})
    client = WorkerClient()
    try:
        ev = client.wait(client.load_pair(TARGET, DRAFT, engine="torch", device="cpu", compare=True), 300)
        assert ev["event"] == "loaded" and ev["engine"] == "torch" and "engine_choice" not in ev
        assert ev["engine_note"].startswith("MLX, measured fastest here before, could not load this model now")
        assert "Apple's GPU" in ev["engine_note"] and "planned PyTorch engine runs it" in ev["engine_note"]
        assert fastest.remembered(cands, TARGET, DRAFT) is None
    finally:
        client.shutdown(10)


def test_compare_names_the_engines_a_catalog_pair_lists_and_nothing_else():
    from engine import protocol as P
    base = {"cmd": "load_pair", "id": "l", "target": "t"}
    assert P.validate_command(dict(base, compare=["torch", "llamacpp"]))["compare"] == ["torch", "llamacpp"]
    with pytest.raises(P.ProtocolError, match="compare lists engines of this build"):
        P.validate_command(dict(base, compare=["vllm"]))
    with pytest.raises(P.ProtocolError, match="wrong type"):
        P.validate_command(dict(base, compare="torch"))
