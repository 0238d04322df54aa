"""The engine CLI as a user runs it: `dflash-desktop generate` and `dflash-desktop bench`."""
import json
import subprocess
import sys

import pytest

from tests.tiny_torch import save_random_pair


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    return save_random_pair(tmp_path_factory.mktemp("cli"), hidden=32, layers=2)


def cli(*args, timeout=180):
    """The command as a user types it; generate runs the torch engine here, as bench does by default (these tests
    hold its block sizes); generate's default engine runs in tests/test_chat_pair.py."""
    if args and args[0] == "generate" and "--engine" not in args:
        args = (*args, "--engine", "torch")
    return subprocess.run([sys.executable, "-m", "dflash_desktop", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_generate_streams_text_and_writes_json(tmp_path, pair_dirs):
    target, draft = pair_dirs
    out = {}
    for mode in ("dflash", "baseline"):
        path = tmp_path / f"{mode}.json"
        extra = ["--baseline"] if mode == "baseline" else []
        proc = cli("generate", "--target", target, "--draft", draft, "--prompt", "def main():",
                   "--max-new-tokens", 24, "--json", path, "--draft-cutoff", 0, "--no-fallback", *extra)
        assert proc.returncode == 0, proc.stderr
        assert "tok/s" in proc.stderr and "peak memory" in proc.stderr
        out[mode] = json.loads(path.read_text())
        assert out[mode]["text"] in proc.stdout.replace("\r", "")
    assert out["dflash"]["mode"] == "dflash" and out["baseline"]["mode"] == "baseline"
    assert out["dflash"]["token_ids"] == out["baseline"]["token_ids"]
    n = len(out["dflash"]["token_ids"])
    assert n == 24 or (n < 24 and out["dflash"]["stop_reason"] == "eos")
    assert "acceptance rate" in cli("generate", "--target", target, "--draft", draft, "--prompt", "x",
                                    "--max-new-tokens", 4).stderr
    stats = out["dflash"]["stats"]
    assert stats["block_size"] == 8 and stats["generated_tokens"] == n
    assert stats["drafted"] == 7 * stats["steps"]      # whole blocks verified (--draft-cutoff 0)


def test_seeded_sampling_is_reproducible_from_the_cli(tmp_path, pair_dirs):
    target, draft = pair_dirs
    runs = []
    for i in range(2):
        path = tmp_path / f"s{i}.json"
        proc = cli("generate", "--target", target, "--draft", draft, "--prompt", "abc", "--temperature", 0.9,
                   "--top-p", 0.95, "--seed", 7, "--max-new-tokens", 16, "--json", path)
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(path.read_text())["token_ids"])
    assert runs[0] == runs[1]


def test_bench_prints_table_and_json(tmp_path, pair_dirs):
    target, draft = pair_dirs
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first prompt\nsecond prompt\n\nthird one\n")
    path = tmp_path / "bench.json"
    proc = cli("bench", "--target", target, "--draft", draft, "--prompts", prompts, "--limit", 2,
               "--max-new-tokens", 12, "--json", path, "--peers", "--draft-cutoff", 0)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(path.read_text())
    assert summary["prompts"] == 2 and summary["all_identical"] is True
    assert summary["draft_cutoff"] == 0.0 and "draft cutoff 0," in proc.stdout
    assert set(summary["tok_s"]) == {"baseline", "dflash", "hf_generate", "hf_prompt_lookup"}
    assert "greedy outputs identical: yes" in proc.stdout and "histogram" in proc.stdout
    assert sum(summary["histogram"]) == sum(len(p["histogram"]) and sum(p["histogram"]) for p in summary["per_prompt"])
    decode = summary["decode_tok_s"]
    assert set(decode) == {"baseline", "dflash"} and min(decode.values()) > 0
    assert summary["decode_speedup"] == pytest.approx(decode["dflash"] / decode["baseline"])
    assert f"DFlash {decode['dflash']:.1f} tok/s, {summary['decode_speedup']:.2f}x" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["generate", "--target", "/nonexistent", "--prompt", "x"], "The target folder /nonexistent does not exist."),
    (["generate", "--draft", "/x", "--prompt", "x"], "--draft needs --target"),
])
def test_cli_errors_are_plain(args, message):
    proc = cli(*args)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_absurd_settings_from_the_cli(pair_dirs):
    target, draft = pair_dirs
    proc = cli("generate", "--target", target, "--draft", draft, "--prompt", "x", "--temperature", -2)
    assert proc.returncode == 2 and "temperature must be 0 (greedy) or from 0.01 to 2" in proc.stderr
    proc = cli("generate", "--target", target, "--draft", draft, "--prompt", "x", "--draft-cutoff", 1.5)
    assert proc.returncode == 2 and "draft_cutoff must be at least 0 and below 1" in proc.stderr
    proc = cli("generate", "--target", target, "--draft", draft, "--prompt", "x", "--block-size", 99)
    assert proc.returncode == 2 and "block_size" in proc.stderr


def test_help_prints_every_command_and_opens_no_window():
    from dflash_desktop.__main__ import ENGINE_COMMANDS
    for flag in ("--help", "-h"):
        proc = cli(flag, timeout=60)
        assert proc.returncode == 0 and proc.stdout.startswith("usage: dflash-desktop"), proc.stderr
        for command in (*ENGINE_COMMANDS, "serve", "--self-test", "--version"):
            assert f"\n  {command} " in proc.stdout, command
        assert "qt" not in proc.stderr.lower()


def test_a_bench_without_a_histogram_says_so_instead_of_drawing_zeros():
    """llama-server reports its accepted drafts in total: bench's table says that, not sixteen empty bars."""
    from engine.bench import format_table
    summary = {"tok_s": {"baseline": 59.4, "dflash": 59.9}, "speedup": {"baseline": 1.01}, "decode_speedup": 0.95,
               "decode_tok_s": {"baseline": 78.5, "dflash": 74.2}, "draft_cutoff": None, "prompts": 2,
               "max_new_tokens": 32, "block_size": 16, "tau": 1.02, "fallbacks": 0, "all_identical": True,
               "histogram": [0] * 16}
    text = format_table(summary)
    assert text.endswith("(this engine reports totals, not a histogram of acceptance lengths)")
    assert "acceptance length histogram" not in text
    summary["histogram"] = [3, 1] + [0] * 14
    assert "acceptance length histogram" in format_table(summary)
