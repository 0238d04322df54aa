"""The figures the stats panel derives, without widgets: the one baseline record (old records still load),
the diagnosis of a slower-than-plain answer from its measurements, repetition, and the CPU meter against a
real busy process."""
from __future__ import annotations

import subprocess
import sys
import time

import psutil

from dflash_desktop.catalog import drafter_training
from dflash_desktop.cpu_load import CpuMeter
from dflash_desktop.session import BaselineRecord, diagnose, looks_like_prose, repetition_share

NOW = time.time()


def test_baseline_record_says_when_how_how_many_and_how_busy_and_reads_old_records():
    rec = BaselineRecord(40.0, 200, NOW, "cpu", "speedup demo", 0.31)
    text = rec.describe()
    assert "40 tok/s" in text and "200 tokens (plain run of the speedup demo)" in text
    assert "other programs used 31% of the CPU meanwhile" in text
    assert BaselineRecord.from_dict(rec.to_dict()) == rec
    old = {"tok_s": 40.0, "tokens": 64, "measured_at": NOW, "device": "cpu"}   # saved before these fields
    assert BaselineRecord.from_dict(old) == BaselineRecord(40.0, 64, NOW, "cpu", "calibration", None)


def test_the_calibration_baseline_is_the_median_run_with_its_range_and_the_busiest_share():
    runs = [({"stats": {"decode_tok_s": r, "generated_tokens": 64}}, cpu) for r, cpu in ((50.0, 0.02), (20.0, 0.4),
                                                                                          (48.0, None))]
    rec = BaselineRecord.median_of(runs, "cpu")
    assert (rec.tok_s, rec.tokens, rec.runs, rec.cpu_other) == (48.0, 64, [50.0, 20.0, 48.0], 0.4)
    text = rec.describe()
    assert "64 tokens (calibration: the median of 3 runs, 20–50 tok/s)" in text
    assert "other programs used 40% of the CPU meanwhile" in text
    assert BaselineRecord.from_dict(rec.to_dict()) == rec
    assert "A busy" not in (diagnose(SLOW, rec) or "") and "Re-measure on a quiet machine" in diagnose(SLOW, rec)


SLOW = {"generated_tokens": 100, "tau": 3.0, "acceptance_rate": 0.5, "decode_tok_s": 30.0, "steps": 33,
        "decode_s": 3.3}


def test_slower_than_plain_is_explained_by_the_step_cost_from_measurements():
    text = diagnose(SLOW, BaselineRecord(40.0, 64, NOW, "cpu"), context={"cpu_other": 0.02})
    assert text.startswith("DFlash ran slower than plain decoding (0.75×)")
    # 3.3 s / 33 steps = 100 ms a step, against 25 ms a plain token: 4.0x
    assert "took 100.0 ms, 4.0× a plain step (25.0 ms)" in text and "3.00 tokens" in text
    assert "busy" not in text and "Low acceptance" not in text
    dspark = diagnose({**SLOW, "speculation": "dspark"}, BaselineRecord(40.0, 64, NOW, "cpu"))
    assert dspark.startswith("DSpark ran slower than plain decoding (0.75×)") and "each DSpark step" in dspark


def test_slower_than_plain_on_a_busy_machine_says_how_busy():
    text = diagnose(SLOW, BaselineRecord(40.0, 64, NOW, "cpu", cpu_other=0.01), context={"cpu_other": 0.48})
    assert "A busy machine: other programs used 48% of the CPU" in text and "step too costly" not in text
    short = diagnose(SLOW, BaselineRecord(40.0, 64, NOW, "cpu"), context={"cpu_other": 0.48, "cpu_wall_s": 0.03})
    assert "busy" not in short and "step too costly" in short     # 3 ticks of CPU time prove nothing
    text = diagnose(SLOW, BaselineRecord(40.0, 64, NOW, "cpu", cpu_other=0.6), context={"cpu_other": 0.0})
    assert "The baseline itself was measured while other programs used 60%" in text


def test_low_acceptance_names_the_likely_cause():
    low = {**SLOW, "tau": 1.2, "acceptance_rate": 0.05}
    base = BaselineRecord(40.0, 64, NOW, "cpu")
    prose = diagnose(low, base, context={"chat_template": False, "prompt": "What is the capital of France?"})
    assert "Low acceptance: the target kept 5% of the drafted tokens" in prose and "code completion model" in prose
    assert "chat mode" in diagnose(low, base, context={"thinking_mismatch": True})
    assert "prompt format" in diagnose(low, base, context={"chat_template": False, "prompt": "def f(x):"})
    chat = {"chat_template": True, "prompt": "Explain the water cycle like I'm five."}
    assert "drafters are usually trained on code and maths" in diagnose(low, base, context=chat)
    ours = diagnose(low, base, context={**chat, "drafter_training": drafter_training("chat")})
    assert "a drafter with little training: this project trained it on a few thousand" in ours, ours
    assert "code and maths" not in ours
    assert drafter_training("demo") is None and drafter_training("no-such-pair") is None
    assert looks_like_prose("Explain speculative decoding in two sentences.")
    assert not looks_like_prose("def read_config(path):\n    return {}")


def test_a_speedup_from_repetition_is_flagged_and_a_varied_one_is_not():
    fast = {**SLOW, "decode_tok_s": 120.0}
    base = BaselineRecord(40.0, 64, NOW, "cpu")
    loop = [5, 6, 7, 8] * 30
    assert repetition_share(loop) > 0.9
    text = diagnose(fast, base, context={"token_ids": loop})
    assert text.startswith("This speedup (3.00×) comes from repetition")
    varied = list(range(120))
    assert repetition_share(varied) == 0 and diagnose(fast, base, context={"token_ids": varied}) is None
    assert repetition_share(text="#\n" * 50) > 0.9    # stored answers: by lines of text


SPIN = "while True: pass"


def spin_until(proc: psutil.Process, seconds: float) -> float:
    before = sum(proc.cpu_times()[:2])
    while sum(proc.cpu_times()[:2]) - before < seconds:
        time.sleep(0.05)
    return sum(proc.cpu_times()[:2]) - before


def detached(code: str) -> psutil.Process:
    """A Python process started through a parent that exits at once: no descendant of this test process."""
    launcher = subprocess.run([sys.executable, "-c", "import subprocess, sys; print(subprocess.Popen("
                               f"[sys.executable, '-c', {code!r}], stdout=subprocess.DEVNULL, "
                               "stderr=subprocess.DEVNULL).pid)"], capture_output=True, text=True, check=True)
    return psutil.Process(int(launcher.stdout))


def test_cpu_meter_counts_another_process_and_not_our_own():
    spinner = detached(SPIN)
    try:
        meter = CpuMeter().start()
        spun = spin_until(spinner, 0.5)
        share = meter.stop()
        assert share is not None and meter.other_s >= spun * 0.8   # the spinner is "another program"
    finally:
        spinner.kill()


def test_cpu_meter_counts_what_our_worker_started_as_ours():
    """A worker's own child (llama.cpp's server) working is the engine, not another program."""
    worker = detached(f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SPIN!r}]).wait()")
    try:
        deadline = time.monotonic() + 30
        while not worker.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        server = worker.children()[0]
        # two meters over the same run, one told about the worker: whatever else the machine does (a test
        # suite beside this one) counts in both, the server's work only in the one that was not told
        told, untold = CpuMeter([worker.pid]).start(), CpuMeter().start()
        spun = spin_until(server, 0.5)
        told.stop(), untold.stop()
        assert untold.other_s - told.other_s >= spun * 0.8, (untold.other_s, told.other_s, spun)
    finally:
        for proc in [*worker.children(recursive=True), worker]:
            proc.kill()


def test_the_speedup_demo_says_whether_it_agrees_with_the_engines_calibrated_choice():
    from dflash_desktop.session import calibration_agreement
    from engine.backends.llamacpp.calibrate import decide
    measured = {"none": {"tok_s": 1400.0, "tau": 1.0}, "dflash 3": {"tok_s": 900.0, "tau": 2.0},
                "dflash 7": {"tok_s": 1000.0, "tau": 2.6}, "ngram 8": {"tok_s": 1300.0, "tau": 1.2}}
    plain_chosen = decide(measured, prompts=3)
    assert calibration_agreement(plain_chosen, 0.7).startswith("This agrees with the engine's choice of plain")
    other = calibration_agreement(plain_chosen, 1.3)
    assert "chose plain decoding" in other and "1400 tok/s" in other and "1000 tok/s" in other
    assert "DFlash at 1000 tok/s at its best (7 drafts per step)" in other
    assert "n-gram lookup at 1300 tok/s at its best (8 drafts per step)" in other
    assert "over 3 prompts" in other and "One prompt can favour" in other
    dflash_chosen = decide({**measured, "dflash 7": {"tok_s": 1500.0, "tau": 2.6}}, prompts=3)
    assert "choice of DFlash with 7 drafts" in calibration_agreement(dflash_chosen, 1.4)
    assert calibration_agreement(None, 1.4) == "" == calibration_agreement({"reason": "torch"}, 1.4)
