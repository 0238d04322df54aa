"""The llama.cpp engine against a real llama-server (the build scripts/dev.sh makes): the demo pair
converted to GGUF decodes greedily token for token like plain llama.cpp and like our torch engine;
cancel and a killed server end an answer cleanly; bad files and mismatched pairs are refused before a
server starts; conversion keeps the drafter's dflash settings."""
import json
from dataclasses import replace
import shutil
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from engine.backends.llamacpp import UBATCH, build

try:
    build.find_build()
except build.BuildMissing as exc:
    pytest.skip(f"no llama.cpp build here ({exc})", allow_module_level=True)

from engine import gguf_metadata as metadata  # noqa: E402
from engine.backends.llamacpp import calibrate, convert  # noqa: E402
from engine.backends.llamacpp.engine import load_pair  # noqa: E402
from engine.backends.torch.engine import load_pair as torch_pair  # noqa: E402
from tests.tiny_torch import save_random_pair  # noqa: E402
from engine.bench import DEMO_DIR, demo_prompts  # noqa: E402
from engine.errors import CheckpointError, EngineError, PairMismatchError  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402

TARGET, DRAFT = DEMO_DIR / "target", DEMO_DIR / "draft"


@pytest.fixture(scope="module", autouse=True)
def app_home(tmp_path_factory):
    """Conversions and calibrations go to a fresh app folder, shared by this module's tests."""
    home = tmp_path_factory.mktemp("home")
    old = os.environ.get("DFLASH_DESKTOP_HOME")
    os.environ["DFLASH_DESKTOP_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("DFLASH_DESKTOP_HOME")
    else:
        os.environ["DFLASH_DESKTOP_HOME"] = old


@pytest.fixture(scope="module")
def pair(app_home):
    p = load_pair(TARGET, DRAFT)
    yield p
    p.close()


def servers() -> list[psutil.Process]:
    return [c for c in psutil.Process().children(recursive=True) if "llama-server" in c.name()]


def prompts(n=3):
    return [text for _, text in demo_prompts(limit=n)]


TIE = 1e-3   # logits this close are a float-rounding tie: llama.cpp's batched verify and its one-token
             # decode use different matrix kernels, so either side of such a tie is the target's output


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def assert_same_up_to_rounding(got: list[int], want: list[int], prompt: list[int], reference) -> bool:
    """got == want, or they part where the target's two best logits are a rounding tie (and got took the
    other one). Returns whether they were identical."""
    import torch
    i = first_difference(got, want)
    if i is None:
        return True
    with torch.no_grad():
        logits = reference.target.model(torch.tensor([prompt + want[:i]])).logits[0, -1].float()
    top = logits.topk(2)
    assert set(top.indices.tolist()) == {want[i], got[i]}, f"token {i}: {got[i]} is not the runner-up of {want[i]}"
    assert float(top.values[0] - top.values[1]) < TIE, f"token {i}: not a tie ({top.values.tolist()})"
    return False


def test_greedy_dflash_equals_plain_llamacpp_and_the_torch_engine(pair):
    """Greedy DFlash in llama.cpp gives plain decoding's tokens, except across a float-rounding tie."""
    reference = torch_pair(TARGET)
    identical, accepted, steps = 0, 0, 0
    for text in prompts(5):
        ids = pair.tokenizer.encode_prompt(text, raw=True)
        assert ids == reference.tokenizer.encode_prompt(text, raw=True)
        want = Generation(reference, ids, GenerationSettings(max_new_tokens=64), baseline=True).run().tokens
        plain = Generation(pair, ids, GenerationSettings(max_new_tokens=64), baseline=True).run()
        fast = Generation(pair, ids, GenerationSettings(max_new_tokens=64, block_size=16)).run()
        assert plain.tokens == want, "llama.cpp's plain decoding differs from the torch engine (f32 weights)"
        identical += assert_same_up_to_rounding(fast.tokens, want, ids, reference)
        assert fast.stop_reason == "length"
        s = fast.stats
        assert s.unknown == () and s.drafted > 0 and 0 < s.accepted <= s.drafted
        assert s.steps == len(fast.tokens) - 1 - s.accepted
        accepted, steps = accepted + s.accepted, steps + s.steps
        assert plain.stats.drafted == 0 and plain.stats.steps == len(plain.tokens) - 1
    assert identical > 5 // 2, "ties are rare: most answers must be identical token for token"
    # over all five (one of them accepts about 1.5 per step in the torch engine too): the drafter reads
    # the target's features, so it accepts far above chance
    assert (accepted + steps) / steps > 2.0


def test_the_repeat_penalty_gives_the_torch_engines_tokens_with_and_without_drafts(pair):
    """llama.cpp's server penalises each verify row after the drafts before it (it samples the rows one at a time);
    with our request it applies the same rule and window as the torch engine. Short prompts make a block's drafts
    repeat tokens the history lacks (tests/test_repeat_penalty.py)."""
    reference = torch_pair(TARGET)
    settings = GenerationSettings(max_new_tokens=40, repeat_penalty=1.5, plain_fallback=False)
    identical, changed = 0, 0
    for text in ("class A:", "x = [", *prompts(2)):
        ids = pair.tokenizer.encode_prompt(text, raw=True)
        want = Generation(reference, ids, settings, baseline=True).run().tokens
        plain = Generation(pair, ids, settings, baseline=True).run()
        fast = Generation(pair, ids, replace(settings, block_size=16)).run()
        assert plain.tokens == want, text
        assert fast.stats.accepted > 0
        identical += fast.tokens == want
        changed += want != Generation(reference, ids, GenerationSettings(max_new_tokens=40), baseline=True).run().tokens
    assert identical >= 3 and changed >= 2


def test_drafted_flags_follow_the_steps(pair):
    ids = pair.tokenizer.encode_prompt(prompts(1)[0], raw=True)
    run = Generation(pair, ids, GenerationSettings(max_new_tokens=96, block_size=16))
    flags = [f for step in run for f in step.drafted]
    assert len(flags) == len(run.tokens) and sum(flags) == run.stats.accepted > 0
    assert flags[0] is False                       # the prefill's token is the target's


def test_each_step_carries_the_servers_own_time_for_it(pair):
    """The plain fallback judges llama.cpp's steps by the server's decoding time (as calibration times plain
    decoding), not by when they reach us: each chunk's seconds are its share of `predicted_ms`."""
    ids = pair.tokenizer.encode_prompt(prompts(1)[0], raw=True)
    start = time.perf_counter()
    chunks = list(pair.stream(ids, GenerationSettings(max_new_tokens=96, block_size=16), baseline=False))
    wall = time.perf_counter() - start
    seconds = [c.seconds for c in chunks]
    assert all(s is not None and s >= 0 for s in seconds) and 0 < sum(seconds) < wall
    steps = [s for c, s in zip(chunks[1:], seconds[1:]) if c.tokens]
    assert len(steps) >= 5 and min(steps) > 0        # every verify step took some decoding time


def test_cancel_mid_answer_stops_the_request_and_the_server_serves_on(pair):
    ids = pair.tokenizer.encode_prompt(prompts(1)[0], raw=True)
    run = Generation(pair, ids, GenerationSettings(max_new_tokens=2000, block_size=16))
    for i, _ in enumerate(run):
        if i == 3:
            run.cancel()
    assert run.stop_reason == "cancelled" and 0 < len(run.tokens) < 200
    start = time.perf_counter()
    again = Generation(pair, ids, GenerationSettings(max_new_tokens=16, block_size=16)).run()
    assert again.stop_reason == "length" and time.perf_counter() - start < 10


def test_a_killed_server_is_an_engine_error_and_the_next_answer_restarts_it(pair):
    ids = pair.tokenizer.encode_prompt(prompts(1)[0], raw=True)
    run = Generation(pair, ids, GenerationSettings(max_new_tokens=5000, block_size=16))
    start = time.perf_counter()
    with pytest.raises(EngineError) as err:
        for i, _ in enumerate(run):
            if i == 2:
                pair.server.proc.kill()
    assert err.value.code == "engine_crashed" and "llama.cpp engine crashed" in str(err.value)
    assert time.perf_counter() - start < 30, "a dead server must not hang the answer"
    again = Generation(pair, ids, GenerationSettings(max_new_tokens=16, block_size=16)).run()
    assert again.stop_reason == "length" and len(again.tokens) == 16


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's command line from /proc")
def test_the_cpu_server_runs_without_flash_attention(pair):
    """On a CPU llama.cpp's flash attention is the slower path for a block of queries (docs/BENCHMARKS.md):
    the drafting server was started with it off and with the micro-batch fit.py counts; the plain one with
    whichever of off and llama.cpp's own auto calibration timed faster."""
    ids = pair.tokenizer.encode_prompt(prompts(1)[0], raw=True)
    for baseline in (True, False):
        Generation(pair, ids, GenerationSettings(max_new_tokens=4, block_size=8), baseline=baseline).run()
        argv = Path(f"/proc/{pair.server.proc.pid}/cmdline").read_bytes().decode().split("\0")
        flags = pair.choice["plain_flash_attn"] if baseline else "off"
        assert argv[argv.index("-fa") + 1] == flags and argv[argv.index("-ub") + 1] == str(UBATCH)
        assert ("-md" in argv) is not baseline


def test_a_block_size_change_restarts_the_server_with_its_n_max(pair):
    ids = pair.tokenizer.encode_prompt(prompts(1)[0], raw=True)
    Generation(pair, ids, GenerationSettings(max_new_tokens=8, block_size=4)).run()
    assert pair.server.launch.n_max == 3 and "--spec-draft-n-max" in pair.server.launch.args(1, Path("k"))
    first = pair.server.proc.pid
    Generation(pair, ids, GenerationSettings(max_new_tokens=8, block_size=4)).run()
    assert pair.server.proc.pid == first, "the same start-time settings keep the server"
    Generation(pair, ids, GenerationSettings(max_new_tokens=8), baseline=True).run()
    assert pair.server.launch.draft is None and pair.server.proc.pid != first


def test_the_server_listens_on_loopback_only(pair):
    ports = [c for c in psutil.Process(pair.server.proc.pid).net_connections() if c.status == "LISTEN"]
    assert ports and all(c.laddr.ip == "127.0.0.1" for c in ports)


def test_calibration_is_remembered_and_says_why(pair):
    choice = calibrate.remembered(pair)
    assert choice is not None and choice == pair.info["speculation"]
    assert set(choice["rates"]) == {"none", "dflash 3", "dflash 7", "dflash 15", "ngram 4", "ngram 8", "ngram 16"}
    assert "over 3 prompts" in choice["reason"] and choice["prompts"] == len(calibrate.prompts(pair)) == 3
    assert (choice["method"], choice["n_max"]) in [("none", 0), *(calibrate.parse(k) for k in choice["rates"])]
    # the fastest setting won, unless its drafts were never accepted (tau 1: only noise makes it look faster)
    eligible = {k: r for k, r in choice["rates"].items() if k == "none" or choice["taus"][k] > 1.0}
    assert max(eligible.values()) == choice["rates"][calibrate.name(choice["method"], choice["n_max"])]
    assert set(choice["by_method"]) == {"none", "dflash", "ngram"}
    for method in ("DFlash", "n-gram lookup", "plain decoding"):     # what ran, and why the others lost
        assert method in choice["reason"]
    # plain decoding was timed with the engine's flash attention (off) and llama.cpp's own; its server keeps the faster
    assert choice["plain_flash_attn"] in ("off", "auto") and pair.plain_flash_attn == choice["plain_flash_attn"]
    assert pair.server_for("none").launch.flash_attn == choice["plain_flash_attn"]
    assert pair.server_for("dflash", 3).launch.flash_attn == pair.flash_attn == "off"
    start = time.perf_counter()
    assert calibrate.choose(pair) == choice and time.perf_counter() - start < 0.5
    saved, pair.flash_attn = pair.flash_attn, "on"            # a choice measured with other server flags
    try:
        assert calibrate.remembered(pair) is None
    finally:
        pair.flash_attn = saved


def test_calibration_takes_turns_over_several_prompts_and_keeps_the_best_total(pair, monkeypatch):
    """Every setting answers every prompt in every round it is timed, the settings alternate round after round (a
    busy moment slows them alike), a speculating setting that fell below half the fastest one's speed in a round
    is not timed again (plain decoding, the baseline, is timed in every round however far behind it is), and the
    choice is the best total over the prompts."""
    calls, measure = [], calibrate.measure

    def recorded(server, prompt, n_max, tokens=calibrate.TOKENS):
        result = measure(server, prompt, n_max, tokens)
        launch = server.launch
        setting = calibrate.name(launch.method, n_max) if n_max else ("plain", launch.flash_attn)
        calls.append((setting, tuple(prompt), result, server.proc.pid))
        lengths.append((tuple(prompt), tokens))
        return result
    lengths: list[tuple] = []
    monkeypatch.setattr(calibrate, "measure", recorded)
    choice = calibrate.choose(pair, force=True)
    settings = {setting for setting, *_ in calls}
    assert settings == {("plain", "off"), ("plain", "auto"), "dflash 3", "dflash 7", "dflash 15", "ngram 4",
                        "ngram 8", "ngram 16"}
    prompts = {tuple(p) for p in calibrate.prompts(pair)}
    assert tuple(calibrate.warm_up(pair)) not in prompts
    timed = {setting: [r for s, prompt, r, _ in calls if s == setting and prompt in prompts] for setting in settings}
    first = {setting: sum(r["tokens"] for r in runs[:len(prompts)]) / sum(r["seconds"] for r in runs[:len(prompts)])
             for setting, runs in timed.items()}
    rounds = {}
    for setting in settings:
        assert prompts <= {prompt for s, prompt, *_ in calls if s == setting}
        rounds[setting], rest = divmod(len(timed[setting]), len(prompts))
        behind = isinstance(setting, str) and first[setting] < calibrate.KEEP_SHARE * max(first.values())
        assert not rest and rounds[setting] == (1 if behind else calibrate.ROUNDS), (setting, first)
    assert all(rounds["plain", flags] == calibrate.ROUNDS for flags in ("off", "auto"))
    # on this pair n-gram lookup measures near plain decoding (every round) and DFlash far below it (one round)
    kept = next((s for s in settings if isinstance(s, str) and rounds[s] == calibrate.ROUNDS), None)
    assert kept, f"every speculating setting measured below half plain decoding's speed: {first}"
    first_plain = [i for i, (s, *_) in enumerate(calls) if s == ("plain", "off")]
    first_draft = [i for i, (s, *_) in enumerate(calls) if s == kept]
    assert min(first_plain) < min(first_draft) < max(first_plain) < max(first_draft), "rounds alternate"
    # n-gram lookup remembers what it saw: each of its settings answers each round on a server of its own,
    # warmed up on a prompt of its own, so no answer is one it has seen before
    ngram = [(s, pid) for s, _, _, pid in calls if isinstance(s, str) and s.startswith("ngram")]
    assert len({pid for _, pid in ngram}) == sum(n for s, n in rounds.items() if str(s).startswith("ngram"))
    assert all(len({s for s, p in ngram if p == pid}) == 1 for _, pid in ngram)
    # the rates are totals over the prompts of each setting's best round (warm-up answers excluded)
    plain_runs = [r for s, prompt, r, _ in calls if s == ("plain", choice["plain_flash_attn"]) and prompt in prompts]
    total = choice["rates"]["none"]
    assert min(r["tokens"] / r["seconds"] for r in plain_runs) <= total <= max(
        r["tokens"] / r["seconds"] for r in plain_runs)
    # every timed answer is as long as plain decoding's speed allows, and the choice says how long
    assert {n for p, n in lengths if p in prompts} == {choice["tokens"]}
    assert choice["tokens"] == calibrate.answer_tokens(lengths and choice["tokens"] and
                                                       _probe_rate(calls, pair), 8 * 3 * calibrate.ROUNDS)
    assert f"({choice['tokens']}-token answers)" in choice["reason"]


def _probe_rate(calls, pair) -> float:
    """Plain decoding's rate on the first answer of a calibration, which sizes its timed answers."""
    first = calls[0][2]
    assert calls[0][1] == tuple(calibrate.warm_up(pair)) and calls[0][0][0] == "plain"
    return first["tokens"] / first["seconds"]


def test_a_setting_far_behind_after_a_round_is_not_timed_again(pair, monkeypatch):
    """Stub timings through the real calibration (its servers start as they would): settings under half the
    fastest one's speed after the first round are timed once, the others every round, and the choice and its
    reason still name every method with its best."""
    speeds = {"none": 100.0, "dflash 3": 150.0, "dflash 7": 160.0, "dflash 15": 70.0, "ngram 4": 90.0,
              "ngram 8": 55.0, "ngram 16": 40.0}
    asked = []

    def stub(server, prompt, n_max, tokens=calibrate.TOKENS):
        setting = calibrate.name(server.launch.method, n_max) if n_max else "none"
        asked.append(setting)
        return {"tokens": tokens, "seconds": tokens / speeds[setting], "drafted": 2 * tokens if n_max else 0,
                "accepted": tokens // 2 if n_max else 0}
    monkeypatch.setattr(calibrate, "measure", stub)
    remembered = calibrate.store().read_bytes()       # the pair's real choice, for the tests after this one
    try:
        choice = calibrate.choose(pair, force=True)
    finally:
        calibrate.store().write_bytes(remembered)
    timed = {s: asked.count(s) for s in speeds}       # with the warm-up answer of each new server (or round)
    n = len(calibrate.prompts(pair))
    assert timed["dflash 15"] == n and timed["ngram 8"] == timed["ngram 16"] == n + 1
    assert timed["dflash 3"] == timed["dflash 7"] == calibrate.ROUNDS * n + 1     # one warm-up on its server a round
    assert timed["ngram 4"] == calibrate.ROUNDS * (n + 1)                          # a new server each round
    assert (choice["method"], choice["n_max"]) == ("dflash", 7)
    assert choice["rates"]["dflash 15"] == 70.0 and "n-gram lookup 90 tokens/s at its best (4 drafts" in \
        choice["reason"]


def test_timed_answers_grow_with_plain_decodings_speed_within_their_bounds():
    """64 tokens a timed answer at the least (a big model on a CPU), 256 at the most, in steps of 64."""
    answers = 48
    assert calibrate.answer_tokens(0.0, answers) == calibrate.answer_tokens(8.0, answers) == 64
    assert calibrate.answer_tokens(450.0, answers) == 128        # 450 x 15 s / 48 answers = 140 tokens
    assert calibrate.answer_tokens(1100.0, answers) == calibrate.answer_tokens(1e6, answers) == 256


def test_drafts_that_were_never_accepted_are_never_chosen_however_fast_they_measured():
    """Seen on SmolLM2 with an untrained drafter under load: tau 1.00 measured 30 tok/s against plain's 22."""
    decided = calibrate.decide({"none": {"tok_s": 22.0, "tau": 1.0}, "dflash 3": {"tok_s": 30.0, "tau": 1.0},
                                "dflash 7": {"tok_s": 4.0, "tau": 1.0}, "ngram 8": {"tok_s": 31.0, "tau": 1.0,
                                                                                  "drafted": 0}})
    assert decided["method"] == "none" and decided["n_max"] == 0 and "plain decoding" in decided["reason"]
    assert "no drafts were accepted" in decided["reason"] and "nothing to draft" in decided["reason"]


def test_a_calibrated_plain_choice_runs_plain_decoding_and_says_why(pair):
    decided = calibrate.decide({"none": {"tok_s": 1000.0, "tau": 1.0}, "dflash 3": {"tok_s": 700.0, "tau": 3.1},
                                "dflash 7": {"tok_s": 800.0, "tau": 4.0}})
    assert decided["method"] == "none" and "plain decoding" in decided["reason"] and decided["speed_share"] == 0.8
    assert "costs more here than the tokens it saves" in decided["reason"]
    saved, pair.choice = pair.choice, decided
    try:
        ids = pair.tokenizer.encode_prompt(prompts(1)[0], raw=True)
        run = Generation(pair, ids, GenerationSettings(max_new_tokens=16)).run()
    finally:
        pair.choice = saved
    assert pair.server.launch.draft is None and run.stats.drafted == 0
    assert run.fallback and run.fallback["reason"] == decided["reason"]


def test_a_file_that_is_not_gguf_gets_a_clear_error(tmp_path, pair):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip file" * 100)
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        load_pair(bad, None)
    real = Path(pair.info["gguf"])
    bad.write_bytes(real.read_bytes()[:4000])
    with pytest.raises(CheckpointError, match="truncated|damaged"):
        load_pair(bad, None)


@pytest.fixture(scope="module")
def other_pair(tmp_path_factory):
    """A random z-lab-format pair of another size, with the demo tokenizer (the converter knows it)."""
    return save_random_pair(tmp_path_factory.mktemp("random"), hidden=128, layers=6, block_size=8,
                            draft_layers=2, tokenizer_dir=TARGET)


def test_a_drafter_for_another_target_is_refused_before_a_server_starts(other_pair):
    _, draft = other_pair
    before = len(servers())
    with pytest.raises(PairMismatchError, match="another model|not made for this target"):
        load_pair(TARGET, draft)
    assert len(servers()) == before


@pytest.mark.parametrize("which", ["demo", "random"])
def test_converted_drafters_keep_their_dflash_settings(which, other_pair):
    target, draft = (TARGET, DRAFT) if which == "demo" else other_pair
    cfg = json.loads((draft / "config.json").read_text())
    meta = metadata.read_metadata(convert.draft_gguf(draft, target))
    dflash = cfg["dflash_config"]
    assert metadata.architecture(meta) == "dflash"
    # llama.cpp counts layer outputs from the embeddings: layer i is i + 1
    assert meta["dflash.target_layers"] == [i + 1 for i in dflash["target_layer_ids"]]
    assert meta["dflash.block_size"] == dflash.get("block_size", cfg.get("block_size"))
    assert meta["tokenizer.ggml.mask_token_id"] == dflash["mask_token_id"]
    assert meta["dflash.block_count"] == cfg["num_hidden_layers"]


def all_servers() -> set[int]:
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "llama-server"}


def test_a_worker_runs_the_demo_pair_with_llamacpp_and_its_server_dies_with_it(pair):
    """engine "auto" (the first start) picks llama.cpp on this CPU; a killed worker leaves no server behind."""
    from dflash_desktop.worker_client import WorkerClient
    before = all_servers()
    client = WorkerClient()
    try:
        loaded = client.wait(client.load_pair(TARGET, DRAFT, engine="auto", device="auto"), 120)
        assert loaded["event"] == "loaded", loaded
        assert loaded["engine"] == "llamacpp" and loaded["speculation"]["reason"]
        done = client.wait(client.generate(prompt="import os\n\n\ndef main():", raw=True,
                                           settings={"max_new_tokens": 32}), 60)
        assert done["event"] == "done" and done["stats"]["generated_tokens"] == 32, done
        assert done["stats"]["unknown"] == []
        assert all_servers() - before, "the worker's llama-server runs"
        folders = Path(os.environ["DFLASH_DESKTOP_HOME"]) / "cache" / "llama-server"
        left = [f for f in folders.iterdir() if f.name.startswith(f"{client.pid}-")]
        assert left and all((f / "llama-server.log").is_file() for f in left)
        os.kill(client.pid, 9)
        deadline = time.monotonic() + 10
        while all_servers() - before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not all_servers() - before, "a killed worker's llama-server must end with it"
        load_pair(TARGET).close()      # the next server start clears what the killed worker left
        assert not any(f.exists() for f in left), left
    finally:
        client.shutdown(10)


def test_auto_engine_leaves_a_drafter_of_the_last_layer_to_torch(tmp_path):
    """A drafter that reads the target's last layer cannot run in llama.cpp, so "auto" gives it to torch
    instead of failing the load; the same drafter on earlier layers goes to llama.cpp, a DFlash2 one too."""
    from engine.backends.choice import auto_engine
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir(), draft.mkdir()
    (target / "config.json").write_text((TARGET / "config.json").read_text())
    cfg = json.loads((DRAFT / "config.json").read_text())
    layers = json.loads((TARGET / "config.json").read_text())["num_hidden_layers"]
    cfg["dflash_config"]["target_layer_ids"] = [1, 2, layers - 1]
    (draft / "config.json").write_text(json.dumps(cfg))
    assert auto_engine(target, "cpu", draft) == "torch"
    cfg["dflash_config"]["target_layer_ids"] = [1, 2, layers - 2]
    (draft / "config.json").write_text(json.dumps(cfg))
    assert auto_engine(target, "cpu", draft) == "llamacpp"
    cfg["architectures"] = ["DFlash2DraftModel"]       # llama.cpp runs DFlash2 drafters too
    cfg["dflash_config"].update(conv_kernel_size=2, conv_group_size=16, selector_rank=16, selector_top_k=8)
    (draft / "config.json").write_text(json.dumps(cfg))
    assert auto_engine(target, "cpu", draft) == "llamacpp"


@pytest.mark.parametrize("device, engine", [("vulkan", "llamacpp"), ("metal", "llamacpp"), ("gpu", "mlx"),
                                            ("cuda", "torch"), ("cuda:1", "torch"), ("mps", "torch")])
def test_auto_gives_a_device_name_to_the_engine_that_uses_it(device, engine):
    """`generate --device vulkan` with the default engine: the engine whose devices go by that name."""
    from engine.backends.choice import auto_engine
    assert auto_engine(TARGET, device, DRAFT) == engine


def test_auto_on_a_cpu_build_of_pytorch_does_not_import_it():
    """PyTorch's "+cpu" wheel has no GPU to ask about: the plan for this CPU is made without importing it."""
    from importlib import metadata
    if not metadata.version("torch").endswith("+cpu") or sys.platform == "darwin":
        pytest.skip("PyTorch here may see a GPU: the plan asks it")
    code = ("import sys; from engine.backends.choice import auto_engine; "
            f"print(auto_engine({str(TARGET)!r}, 'auto', {str(DRAFT)!r}), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["llamacpp", "False"], out.stderr[-2000:]


def test_a_pair_with_a_hugging_face_tokenizer_loads_without_pytorch(tmp_path):
    """The code pair's target is a Hugging Face folder whose tokenizer the engine reads: transformers'
    AutoTokenizer imports its model code and with it PyTorch (about 450 MB in the worker). Here tokenizer.json is
    read as it stands, also where tokenizer_config.json names a class transformers would rebuild (Qwen2Tokenizer),
    and the prompt's tokens are those AutoTokenizer gives."""
    from transformers import AutoTokenizer
    renamed = tmp_path / "named"
    renamed.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (TARGET / name).is_file():
            shutil.copy(TARGET / name, renamed / name)
    config = json.loads((renamed / "tokenizer_config.json").read_text())
    (renamed / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "Qwen2Tokenizer"}))
    text = prompts(1)[0]
    code = ("import sys; from engine.backends.llamacpp.engine import load_pair; "
            "from engine.tokenizer import ChatTokenizer; "
            f"p = load_pair({str(TARGET)!r}, {str(DRAFT)!r}); ids = p.tokenizer.encode_prompt({text!r}, raw=True); "
            "p.close(); "
            f"named = ChatTokenizer.from_folder({str(renamed)!r}, as_serialized=True); "
            f"print(ids == named.encode_prompt({text!r}, raw=True), ids, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    same, *ids, torch_loaded = out.stdout.split()
    assert torch_loaded == "False" and same == "True", out.stdout
    assert AutoTokenizer.from_pretrained(str(TARGET)).encode(text, add_special_tokens=False) == json.loads("".join(ids))


@pytest.mark.parametrize("architecture", ["LlamaForCausalLMEagle3", "DSparkDraftModel", "Lfm2DSparkDraftModel"])
def test_auto_engine_gives_drafters_only_llamacpp_runs_to_llamacpp(tmp_path, architecture):
    """Only llama.cpp runs EAGLE-3 and DSpark drafters the torch engine does not compute (another backbone or
    layout, a config it cannot read): "auto" sends such a folder there on any device, where torch would refuse it;
    the same target with a DFlash drafter, or a complete DSpark one in DeepSpec's layout, on a GPU stays with torch
    (a complete EAGLE-3 one in SpecForge's: tests/test_engine_eagle3.py)."""
    from engine.backends.choice import auto_engine
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir(), draft.mkdir()
    (target / "config.json").write_text((TARGET / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    assert auto_engine(target, "cpu", draft) == auto_engine(target, "cuda", draft) == "llamacpp"
    (draft / "config.json").write_text((DRAFT / "config.json").read_text())
    assert auto_engine(target, "cuda", draft) == "torch"
    dspark = {**json.loads((DRAFT / "config.json").read_text()), "architectures": ["DSparkDraftModel"],
              "markov_rank": 16}
    (draft / "config.json").write_text(json.dumps(dspark))
    assert auto_engine(target, "cuda", draft) == "torch" and auto_engine(target, "cpu", draft) == "llamacpp"


def test_a_pair_of_gguf_files_from_disk_loads_in_a_worker(pair, tmp_path):
    """What "Open a model from disk" sends: a target GGUF file and a DFlash GGUF file, engine llama.cpp; the
    same target with the torch engine, which cannot unpack this one, is refused naming llama.cpp, and a missing
    file too."""
    from dflash_desktop.worker_client import WorkerClient
    from ui.local_pair_dialog import engine_for
    target_gguf, draft_gguf = Path(pair.info["gguf"]), Path(pair.info["draft_gguf"])
    assert engine_for(target_gguf) == "llamacpp" and engine_for(TARGET) == "auto"
    client = WorkerClient()
    try:
        loaded = client.wait(client.load_pair(target_gguf, draft_gguf, engine="llamacpp", device="cpu"), 120)
        assert loaded["event"] == "loaded" and loaded["gguf"] == str(target_gguf), loaded
        done = client.wait(client.generate(prompt="import os\n\n\ndef main():", raw=True,
                                           settings={"max_new_tokens": 16}), 60)
        assert done["event"] == "done" and done["stats"]["generated_tokens"] == 16, done
        refused = client.wait(client.load_pair(target_gguf, None, engine="torch", device="cpu"), 60)
        assert refused["event"] == "error" and "llama.cpp engine" in refused["message"], refused
        missing = client.wait(client.load_pair(tmp_path / "gone.gguf", None, engine="llamacpp", device="cpu"), 60)
        assert missing["event"] == "error" and "does not exist" in missing["message"], missing
    finally:
        client.shutdown(10)


def test_auto_falls_back_to_torch_when_llamacpp_cannot_convert_the_pair(tmp_path):
    """A pair whose tokenizer llama.cpp's converter does not know still loads under "auto": the worker
    runs it with torch and the loaded event says why."""
    from dflash_desktop.worker_client import WorkerClient
    from tests.ui_chat_fixtures import save_echo_pair
    target, draft = save_echo_pair(tmp_path)
    client = WorkerClient()
    try:
        loaded = client.wait(client.load_pair(target, draft, engine="auto", device="auto"), 120)
        assert loaded["event"] == "loaded", loaded
        assert loaded["engine"] == "torch" and "llama.cpp could not run this pair" in loaded["engine_note"]
        asked = client.wait(client.load_pair(target, draft, engine="llamacpp", device="cpu"), 120)
        assert asked["event"] == "error" and "converter" in asked["message"], asked   # asked for by name: no fallback
    finally:
        client.shutdown(10)


def test_the_plain_fallback_switch_off_runs_dflash_at_its_fastest_measured_setting(pair):
    saved = pair.choice
    try:
        pair.choice = calibrate.decide({"none": {"tok_s": 900.0, "tau": 1.0}, "dflash 3": {"tok_s": 700.0, "tau": 2},
                                        "dflash 7": {"tok_s": 800.0, "tau": 3.0}, "ngram 8": {"tok_s": 600, "tau": 2}})
        method, n, fallback = pair.plan(GenerationSettings(), baseline=False)
        assert (method, n) == ("none", 0) and fallback["reason"] == pair.choice["reason"]
        assert pair.plan(GenerationSettings(plain_fallback=False), baseline=False) == ("dflash", 7, None)
        assert pair.plan(GenerationSettings(plain_fallback=False), baseline=True) == ("none", 0, None)
        assert pair.plan(GenerationSettings(block_size=4), baseline=False) == ("dflash", 3, None)
    finally:
        pair.choice = saved


def test_a_request_may_draft_nothing_on_a_drafting_server(pair):
    """Our patch (patches/0002): `speculative.n_max` in a request lowers the server's drafts per step, and
    0 decodes plainly on the drafting server, with plain decoding's tokens. Stock llama-server ignores the
    field (per-request speculative settings are compiled out there) and keeps drafting."""
    from engine.backends.llamacpp.server import request_body
    ids = pair.tokenizer.encode_prompt(prompts(1)[0], raw=True)
    settings = GenerationSettings(max_new_tokens=48)
    server = pair.server_for("dflash", pair.block_size - 1)

    def answer(extra):
        tokens, last = [], {}
        for event in server.stream({**request_body(ids, settings), **extra}):
            tokens, last = tokens + (event.get("tokens") or []), event
        return tokens, last["timings"]
    _, drafting = answer({})
    plain, timings = answer({"speculative.n_max": 0})
    assert drafting["draft_n"] > 0 and timings.get("draft_n", 0) == 0
    assert plain == Generation(pair, ids, settings, baseline=True).run().tokens


def test_an_answer_whose_drafts_stop_paying_continues_plainly_on_the_same_server(pair):
    """The loop's plain fallback mid-answer: with plain steps timed at a microsecond no DFlash step keeps
    pace, so after FALLBACK_MIN_STEPS steps the loop calls stop_drafting(), and the rest of the answer comes
    from the same server drafting nothing. The whole answer is still plain decoding's."""
    from engine.loop import FALLBACK_MIN_STEPS, StepCosts
    ids = pair.tokenizer.encode_prompt(prompts(3)[2], raw=True)      # tau about 2.7: over 100 steps
    settings = GenerationSettings(max_new_tokens=300, block_size=16)
    server = pair.server_for("dflash", pair.block_size - 1)
    costs = StepCosts()
    costs.plain.append(1e-6)
    run = Generation(pair, ids, settings, costs=costs)
    steps = list(run)
    switch = run.fallback["after_tokens"]
    assert [s.fallback for s in steps if s.fallback] == [run.fallback] and run.stats.fallback == run.fallback
    assert FALLBACK_MIN_STEPS < switch < 300 and "break-even" in run.fallback["reason"]
    assert pair.server is server and server.proc.poll() is None          # the same server, not a restart
    flags = [f for s in steps for f in s.drafted]
    assert len(run.tokens) == len(flags) == 300 and run.stop_reason == "length"
    assert any(flags[:switch]) and not any(flags[switch:])               # nothing drafted after the switch
    assert run.stats.accepted == sum(flags) and run.stats.steps == 300 - 1 - run.stats.accepted
    # the plain rest did not feed the drafter's context: a next turn over it drafts with a gap, still exact
    follow = ids + run.tokens + pair.tokenizer.encode_prompt("\n\n\ndef main():\n", raw=True)
    again = Generation(pair, follow, GenerationSettings(max_new_tokens=64, block_size=16, plain_fallback=False)).run()
    assert pair.server is server and again.stats.drafted > 0
    reference = torch_pair(TARGET)
    for answer, prompt in ((run, ids), (again, follow)):
        plain = Generation(pair, prompt, GenerationSettings(max_new_tokens=len(answer.tokens)), baseline=True).run()
        assert_same_up_to_rounding(answer.tokens, plain.tokens, prompt, reference)


def test_token_ids_of_characters_split_across_tokens_all_arrive(other_pair):
    """Our patch (patches/0003): a random target over the demo's byte-level tokenizer often emits tokens
    that end partway through a UTF-8 character; stock llama-server never streams their ids, so answers
    lost tokens (and ended early). Every id arrives now: the same tokens as the torch engine's."""
    target, _ = other_pair
    lc, reference = load_pair(target, None), torch_pair(target)
    try:
        settings = GenerationSettings(max_new_tokens=64)
        split = 0
        for text in ("import os\n", "# 你好", "def f(x):"):
            ids = reference.tokenizer.encode_prompt(text, raw=True)
            want = Generation(reference, ids, settings, baseline=True).run()
            got = Generation(lc, ids, settings, baseline=True).run()
            assert got.tokens == want.tokens and got.stop_reason == want.stop_reason
            pieces = [reference.tokenizer.decode([t]) for t in want.tokens]
            split += sum("\ufffd" in piece for piece in pieces)
        assert split > 0, "the answers hold no token that ends inside a character: the test checks nothing"
    finally:
        lc.close()


# -- the child server closed to other programs and web pages; AMX; crashes; drafters beside a model ----------

def test_the_child_server_answers_only_the_app_and_no_web_page(pair):
    """A page or program that finds the port gets nothing: every request but /health needs the key made for
    this start, no origin is allowed, /slots is off, and the key is not on the command line."""
    import http.client
    port, key = pair.server.port, pair.server.key

    def ask(method, path, headers, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()
    page = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    body = json.dumps({"prompt": "hello", "n_predict": 4})
    for method, path in (("POST", "/completion"), ("GET", "/props"), ("GET", "/slots"), ("POST", "/tokenize")):
        status, headers, _ = ask(method, path, page, body if method == "POST" else None)
        assert status == 401, (path, status)
        assert headers.get("Access-Control-Allow-Origin") != "http://evil.example"
    status, headers, _ = ask("OPTIONS", "/completion", {"Origin": "http://evil.example"})
    assert headers.get("Access-Control-Allow-Origin") not in ("*", "http://evil.example")
    keyed = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    assert ask("POST", "/completion", keyed, body)[0] == 200
    assert ask("GET", "/slots", keyed)[0] != 200                   # the monitor is off even with the key
    if sys.platform.startswith("linux"):
        argv = Path(f"/proc/{pair.server.proc.pid}/cmdline").read_bytes().decode()
        assert key not in argv and not (pair.server.folder / "key").exists()


@pytest.mark.parametrize("flags, safe", [
    ("fpu sse avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", False),   # Sapphire Rapids (recorded lscpu)
    ("fpu sse avx2 avx512f avx512_bf16 avx512_vnni", True),              # AMD Zen 4
    ("", True)])
def test_repacking_is_off_exactly_on_cpus_with_amx(flags, safe):
    from engine.backends.llamacpp import cpu
    info = f"processor\t: 0\nflags\t\t: {flags}\n"
    assert cpu.repack_safe(cpu.cpu_flags(info)) is safe
    from engine.backends.llamacpp.server import Launch
    args = Launch(Path("llama-server"), Path("m.gguf"), repack=safe).args(1, Path("key"))
    assert ("--no-repack" in args) is not safe


def test_this_machines_server_repacks_only_without_amx(pair):
    from engine.backends.llamacpp import cpu
    assert pair.server.launch.repack == cpu.repack_safe()
    assert ("--no-repack" in pair.server.launch.args(1, Path("k"))) == bool(cpu.cpu_flags() & set(cpu.AMX_FLAGS))


def test_a_server_that_crashes_while_loading_is_an_engine_crash_with_its_log_kept(tmp_path, app_home):
    """A llama-server killed by a signal while it loads (as AMX CPUs crash) names the crash and keeps its log."""
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'loading model tensors'\nkill -SEGV $$\n")
    fake.chmod(0o755)
    from engine.backends.llamacpp.server import Launch, Server, ServerError
    with pytest.raises(ServerError) as err:
        Server(Launch(fake, TARGET / "x.gguf"))
    assert err.value.code == "engine_crashed" and "SIGSEGV" in str(err.value)
    assert "loading model tensors" in str(err.value)
    kept = sorted((Path(app_home) / "cache" / "logs").glob("llama-server-crash-*.log"))
    assert kept and "loading model tensors" in kept[-1].read_text()


def test_auto_takes_torch_when_the_llamacpp_server_crashes_while_loading(tmp_path, monkeypatch):
    """A llama-server that dies while loading (here: a build whose server segfaults) leaves the pair to torch
    under "auto", and the loaded event says why; asked for by name, the crash is the answer, and a GGUF file
    (which only llama.cpp reads) gets the crash with no other engine to offer."""
    from dflash_desktop.worker_client import WorkerClient
    home = tmp_path / "crashing-build"
    real = build.find_build()
    shutil.copytree(real, home, symlinks=True)
    server = next(p for p in home.rglob("llama-server") if p.is_file())
    server.unlink()
    server.write_text("#!/bin/sh\necho 'ggml_backend_amx_mul_mat: crashed'\nkill -SEGV $$\n")
    server.chmod(0o755)
    monkeypatch.setenv(build.HOME_ENV, str(home))
    client = WorkerClient()
    try:
        loaded = client.wait(client.load_pair(TARGET, DRAFT, engine="auto", device="auto"), 120)
        assert loaded["event"] == "loaded" and loaded["engine"] == "torch", loaded
        assert "crashed" in loaded["engine_note"] and "SIGSEGV" in loaded["engine_note"]
        asked = client.wait(client.load_pair(TARGET, DRAFT, engine="llamacpp", device="cpu"), 120)
        assert asked["event"] == "error" and asked["code"] == "engine_crashed", asked
        assert "SIGSEGV" in asked["message"] and "amx_mul_mat: crashed" in asked["stderr_tail"][-1]
        assert "AMX kernels crash on this CPU" in asked["message"] and Path(asked["log_path"]).is_file()
    finally:
        client.shutdown(10)


def test_a_drafter_beside_a_gguf_pairs_itself(pair, tmp_path):
    """Open from disk with only the model: a `*DFlash*.gguf` beside it that belongs to it loads as its drafter;
    one made for another target is passed over."""
    folder = tmp_path / "models"
    folder.mkdir()
    target = folder / "demo-target-f32.gguf"
    os.link(pair.info["gguf"], target)
    os.link(pair.info["draft_gguf"], folder / "demo-target-DFlash-f16.gguf")
    loaded = load_pair(target)
    try:
        assert loaded.info["has_drafter"] and loaded.info["draft_gguf"].endswith("demo-target-DFlash-f16.gguf")
    finally:
        loaded.close()
    (folder / "demo-target-DFlash-f16.gguf").unlink()
    alone = load_pair(target)
    try:
        assert not alone.info["has_drafter"]
    finally:
        alone.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="stops the server with SIGSTOP")
def test_cancel_ends_an_answer_within_a_second_even_when_the_server_hangs(pair):
    """A llama-server that stops sending (here: frozen with SIGSTOP) no longer holds a cancel for the read's
    600 s: the answer ends as cancelled at once, the hung server is replaced, and the next answer runs."""
    import signal
    import threading
    ids = pair.tokenizer.encode_prompt(prompts(1)[0], raw=True)
    run = Generation(pair, ids, GenerationSettings(max_new_tokens=5000, block_size=16))
    stamps = {}
    for i, _ in enumerate(run):
        if i == 2:
            hung = pair.server.proc
            hung.send_signal(signal.SIGSTOP)
            stamps["cancel"] = time.perf_counter()
            threading.Timer(0.2, run.cancel).start()
    took = time.perf_counter() - stamps["cancel"]
    try:
        assert run.stop_reason == "cancelled" and took < 0.2 + 1.0, took   # the health check waits for the next answer
        again = Generation(pair, ids, GenerationSettings(max_new_tokens=16, block_size=16)).run()
        assert again.stop_reason == "length" and len(again.tokens) == 16
        assert pair.server.proc is not hung and hung.poll() is not None, "the hung server was replaced"
    finally:
        if hung.poll() is None:
            hung.send_signal(signal.SIGCONT)


def test_quitting_with_a_loaded_llamacpp_pair_leaves_no_server(pair):
    """The app's quit (the worker's shutdown, which ends with os._exit) stops the llama-server at once."""
    from dflash_desktop.worker_client import WorkerClient
    before = all_servers()
    client = WorkerClient()
    loaded = client.wait(client.load_pair(TARGET, DRAFT, engine="llamacpp", device="cpu"), 120)
    assert loaded["event"] == "loaded", loaded
    started = all_servers() - before
    assert started
    assert client.shutdown(10) == 0
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in started), "a llama-server outlived the worker's shutdown"


def test_a_server_killed_mid_answer_offers_the_engines_that_run_the_pair(pair):
    """Through the worker, as the window sees it: the answer ends with `engine_crashed`, the likely cause, the
    server's last log lines for the diagnostics, and the other engines that run this pair here."""
    from dflash_desktop.worker_client import WorkerClient
    client = WorkerClient()
    try:
        loaded = client.wait(client.load_pair(TARGET, DRAFT, engine="llamacpp", device="cpu"), 120)
        assert loaded["event"] == "loaded", loaded
        rid = client.generate(prompt="import os\n\n\ndef main():", raw=True, settings={"max_new_tokens": 3000})
        deadline = time.monotonic() + 60
        while not servers_of(client.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        for server in servers_of(client.pid):
            server.kill()
        failed = client.wait(rid, 60)
        assert failed["event"] == "error" and failed["code"] == "engine_crashed", failed
        assert "SIGKILL" in failed["message"] and "from outside" in failed["message"]
        assert failed["alternatives"][0] == "torch" and "llamacpp" not in failed["alternatives"]
        assert failed["stderr_tail"] and Path(failed["log_path"]).is_file()
    finally:
        client.shutdown(10)


def servers_of(pid: int) -> list[psutil.Process]:
    return [c for c in psutil.Process(pid).children(recursive=True) if c.name() == "llama-server"]


def test_a_cancel_before_the_request_reaches_the_server_still_stops_the_answer(pair):
    """Cancelled before streaming begins (queued, or while a server starts): no prefill is waited for."""
    ids = pair.tokenizer.encode_prompt(prompts(1)[0], raw=True)
    run = Generation(pair, ids, GenerationSettings(max_new_tokens=5000, block_size=16))
    run.cancel()
    start = time.perf_counter()
    run.run()
    assert run.stop_reason == "cancelled" and len(run.tokens) == 0 and time.perf_counter() - start < 1.0
    after = Generation(pair, ids, GenerationSettings(max_new_tokens=8, block_size=16)).run()
    assert after.stop_reason == "length" and len(after.tokens) == 8


def test_a_gguf_without_tokenizer_files_keeps_working_after_its_server_was_stopped(smollm2_gguf):
    """Its tokenizer is the server's: with the server gone (after a crash), the next prompt starts one."""
    from engine.backends.llamacpp.engine import load_pair as llamacpp_pair
    smol = llamacpp_pair(smollm2_gguf)
    try:
        smol.stop_server()
        ids = smol.tokenizer.encode_chat([{"role": "user", "content": "Hello"}])
        assert ids and smol.server is not None
        assert Generation(smol, ids, GenerationSettings(max_new_tokens=4), baseline=True).run().tokens
    finally:
        smol.close()
