"""Baseline vs DFlash (and the peers a user might pick instead) on a prompt set, measured in one run
so the ratios are fair on a shared, noisy machine."""
from __future__ import annotations

import json
import sysconfig
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import assets

from .errors import EngineError
from .limits import GenerationSettings
from .loop import Generation, StepCosts

DEMO_DIR = assets.path("demo")


def demo_prompts(limit: int | None = None, chars: int = 1200) -> list[tuple[str, str]]:
    """(name, text) prompts: the opening of each held-out standard-library file the demo pair never saw."""
    recipe = json.loads((DEMO_DIR / "RECIPE.json").read_text(encoding="utf-8"))
    root = Path(sysconfig.get_paths()["stdlib"])
    prompts = []
    for rel in recipe["corpus"]["held_out_files"]:
        path = root / rel
        if not path.is_file():
            continue  # another Python version may lack the file
        cut = file_opening(path.read_text(encoding="utf-8", errors="replace"), chars)
        if cut.strip():
            prompts.append((rel, cut))
    return prompts[:limit] if limit else prompts


def file_opening(text: str, chars: int = 1200) -> str:
    """The first ``chars`` characters of a file, ending at a line's end, before its newline: the BPE
    merges a newline with the next line's indentation, so a prompt ending in a bare newline would
    not look like training text."""
    cut = text[:chars]
    return cut[: cut.rindex("\n")] if "\n" in cut else cut


def chat_prompts(limit: int | None = None) -> list[tuple[str, str]]:
    """(name, text) prompts: the one-message questions of the chat pair's held-out set, which its drafter never
    saw (assets/chat/held_out.jsonl, from scripts/chat_prompts.py)."""
    lines = assets.path("chat", "held_out.jsonl").read_text(encoding="utf-8").splitlines()
    chats = [json.loads(line) for line in lines if line.strip()]
    out = [(f"held-out {i}", c[0]["content"]) for i, c in enumerate(chats) if len(c) == 1]
    return out[:limit] if limit else out


def load_prompts(path: Path) -> list[tuple[str, str]]:
    """A JSON list of strings (or of {"name", "prompt"}), or a text file with one prompt per line."""
    text = Path(path).read_text(encoding="utf-8")
    if Path(path).suffix == ".json":
        items = json.loads(text)
        return [(f"p{i}", p) if isinstance(p, str) else (p.get("name", f"p{i}"), p["prompt"])
                for i, p in enumerate(items)]
    return [(f"p{i}", line) for i, line in enumerate(text.splitlines()) if line.strip()]


@dataclass
class PromptResult:
    name: str
    prompt_tokens: int
    tok_s: dict[str, float] = field(default_factory=dict)   # method -> end-to-end tokens/s
    tokens: dict[str, int] = field(default_factory=dict)
    decode_s: dict[str, float] = field(default_factory=dict)  # our methods: seconds after the first token
    tau: float = 0.0
    acceptance_rate: float = 0.0
    histogram: list[int] = field(default_factory=list)
    accepted: int = 0                # drafts kept, and verify steps: engines that run their own loop
    steps: int = 0                   # report totals, not a histogram
    identical: bool = True
    fell_back: bool = False          # DFlash switched to plain decoding part-way (engine/loop.py)


def _hf_generate(pair, ids: list[int], n: int, **kwargs) -> tuple[list[int], float]:
    """transformers' own generate() on the torch engine's target, on stock linear layers."""
    import torch

    from .backends.torch.packed import stock_linears
    model = pair.target.model
    eos = list(pair.eos_ids) or None
    inp = torch.tensor([ids], device=pair.target.device)
    start = time.perf_counter()
    with torch.inference_mode(), stock_linears(model):
        out = model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos[0] if eos else 0, **kwargs)
    elapsed = time.perf_counter() - start
    new = out[0, len(ids):].tolist()
    if eos and new and new[-1] in eos:
        new = new[:-1]
    return new, elapsed


def run_bench(pair, prompts: list[tuple[str, str]], settings: GenerationSettings = GenerationSettings(),
              raw: bool = True, peers: bool = False, progress=print) -> dict:
    """Plain decoding and DFlash (and the peers) on each prompt in turn, greedy, with the same settings."""
    if peers and pair.info["engine"] != "torch":
        raise EngineError("--peers times transformers' generate(), which needs the torch engine.")
    max_new_tokens = settings.max_new_tokens
    warm = pair.tokenizer.encode_prompt(prompts[0][1], raw=raw)
    costs = StepCosts()              # the pair's plain step cost, kept across its runs as the worker keeps it
    for baseline in (True, False):   # warm-up, not timed
        Generation(pair, warm, replace(settings, max_new_tokens=8), baseline=baseline, costs=costs).run()
    results = []
    for i, (name, text) in enumerate(prompts):
        ids = pair.tokenizer.encode_prompt(text, raw=raw)
        # the order alternates: an engine that keeps the last prompt's cache (llama-server, where both runs
        # may use one server) would otherwise spare the second run its prefill every time
        runs = {baseline: Generation(pair, ids, settings, baseline=baseline, costs=costs).run()
                for baseline in ((False, True) if i % 2 else (True, False))}
        base, fast = runs[True], runs[False]
        r = PromptResult(name, len(ids), tau=fast.stats.tau, acceptance_rate=fast.stats.acceptance_rate,
                         histogram=fast.stats.histogram, accepted=fast.stats.accepted, steps=fast.stats.steps,
                         identical=base.tokens == fast.tokens,
                         fell_back=fast.fallback is not None)
        for method, run in (("baseline", base), ("dflash", fast)):
            r.tok_s[method] = run.stats.end_to_end_tok_s
            r.tokens[method] = len(run.tokens)
            r.decode_s[method] = run.stats.decode_s
        if peers:
            for method, kwargs in (("hf_generate", {}), ("hf_prompt_lookup", {"prompt_lookup_num_tokens": 10})):
                toks, secs = _hf_generate(pair, ids, max_new_tokens, **kwargs)
                r.tok_s[method] = len(toks) / secs if secs else 0.0
                r.tokens[method] = len(toks)
                r.identical &= toks == base.tokens
        results.append(r)
        progress(f"{name}: baseline {r.tok_s['baseline']:.1f} tok/s, DFlash {r.tok_s['dflash']:.1f} tok/s, "
                 f"tau {r.tau:.2f}, identical {r.identical}")
    return summarize(results, pair, max_new_tokens, settings.draft_cutoff)


def summarize(results: list[PromptResult], pair, max_new_tokens: int, draft_cutoff: float | None) -> dict:
    methods = list(results[0].tok_s)
    # aggregate throughput: total tokens over total time, so long prompts are not under-weighted
    total = {}
    for m in methods:
        secs = sum(r.tokens[m] / r.tok_s[m] for r in results if r.tok_s[m])
        total[m] = sum(r.tokens[m] for r in results) / secs if secs else 0.0
    # decode only: tokens after the first per second after the first (prefill and first token excluded)
    decode = {m: sum(r.tokens[m] - 1 for r in results) / secs
              for m in ("baseline", "dflash") if (secs := sum(r.decode_s[m] for r in results))}
    hist = [sum(col) for col in zip(*(r.histogram for r in results))]
    steps = sum(hist)
    all_steps = sum(r.steps for r in results)
    tau = (sum((i + 1) * c for i, c in enumerate(hist)) / steps if steps
           else (sum(r.accepted for r in results) + all_steps) / all_steps if all_steps else 0.0)
    return {
        "pair": pair.name, "engine": pair.info["engine"], "device": pair.info["device"],
        "dtype": pair.info["dtype"], "block_size": pair.block_size, "prompts": len(results),
        "max_new_tokens": max_new_tokens, "draft_cutoff": draft_cutoff, "tok_s": total,
        "speculation": pair.info.get("speculation"),
        "speedup": {m: total["dflash"] / total[m] for m in methods if m != "dflash" and total[m]},
        "decode_tok_s": decode,
        "decode_speedup": decode["dflash"] / decode["baseline"] if len(decode) == 2 else 0.0,
        "tau": tau,
        "histogram": hist, "all_identical": all(r.identical for r in results),
        "exact_expected": pair.info.get("exact", True),
        "fallbacks": sum(r.fell_back for r in results),
        "per_prompt": [r.__dict__ for r in results],
        "machine": machine_line(), "date": time.strftime("%Y-%m-%d"),
    }


def machine_line() -> str:
    import os

    import torch

    from .machine import cpu_model
    return f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"


def identical_note(summary: dict) -> str:
    if summary["all_identical"]:
        return "yes"
    if not summary.get("exact_expected", True):
        return ("no, as expected on quantized weights: llama.cpp rounds a verify's products otherwise than one "
                "step's, so answers can part where two tokens are close (docs/engines/llamacpp.md)")
    return "NO"


def format_table(summary: dict) -> str:
    methods = list(summary["tok_s"])
    lines = [f"{'method':<18}{'tok/s':>10}{'DFlash speedup':>16}"]
    for m in methods:
        sp = "" if m == "dflash" else f"{summary['speedup'].get(m, 0):.2f}x"
        lines.append(f"{m:<18}{summary['tok_s'][m]:>10.1f}{sp:>16}")
    decode = summary["decode_tok_s"]
    cutoff = "automatic" if summary["draft_cutoff"] is None else f"{summary['draft_cutoff']:g}"
    if summary["decode_speedup"]:
        lines.append(f"decoding only (prefill excluded): baseline {decode['baseline']:.1f}, "
                     f"DFlash {decode['dflash']:.1f} tok/s, {summary['decode_speedup']:.2f}x")
    lines.append(f"prompts {summary['prompts']}, max new tokens {summary['max_new_tokens']}, "
                 f"block size {summary['block_size']}, draft cutoff {cutoff}, "
                 f"tau {summary['tau']:.2f}, plain fallbacks {summary['fallbacks']}, "
                 f"greedy outputs identical: {identical_note(summary)}")
    if summary.get("speculation"):
        lines.append(f"engine's choice: {summary['speculation']['reason']}")
    hist = summary["histogram"]
    if not any(hist):      # llama-server reports how many drafts it accepted in all, not per step
        return "\n".join(lines + ["(this engine reports totals, not a histogram of acceptance lengths)"])
    peak = max(hist) or 1
    lines.append("acceptance length histogram (tokens committed per verify pass):")
    for n, c in enumerate(hist, 1):
        lines.append(f"  {n:>2} {'#' * round(30 * c / peak):<30} {c}")
    return "\n".join(lines)


def twin_drafters(pairs: dict, prompts: list[list[int]], widths: tuple[int, ...], max_new_tokens: int,
                  **settings) -> dict:
    """Two drafters that draft the same tokens (`pairs`: method label -> (pair, method setting)), each answer run
    once with each at every block width, alternating which goes first, after plain decoding of the same answer on
    the first pair; the first prompt runs once more before them, unmeasured (a warm-up). Sums per (label, width):
    tokens after the first, decoding seconds, verify steps, draft-pass seconds and passes (step engines time them;
    llama.cpp's server does not); whether both kept the same
    tokens, drafts and acceptances. Returns {"sums", "plain": [tokens, s], "same", "total"}."""
    labels = list(pairs)
    first = pairs[labels[0]][0]
    sums = {(label, w): [0, 0.0, 0, 0.0, 0] for label in labels for w in widths}
    plain, same, total = [0, 0.0], 0, 0
    for i, ids in enumerate([prompts[0]] + prompts):
        base = dict(max_new_tokens=max_new_tokens, plain_fallback=False, **settings)
        ref = Generation(first, ids, GenerationSettings(**base), baseline=True).run()
        if i:
            plain[0] += ref.stats.generated_tokens - 1
            plain[1] += ref.stats.decode_s
        for w in widths:
            runs = {}
            for label in (labels if (i + w) % 2 else labels[::-1]):
                pair, method = pairs[label]
                runs[label] = r = Generation(pair, ids, GenerationSettings(**base, method=method, block_size=w)).run()
                if i:
                    s = sums[label, w]
                    s[0] += r.stats.generated_tokens - 1
                    s[1] += r.stats.decode_s
                    s[2] += r.stats.generated_tokens - r.stats.accepted
                    s[3] += r.stats.draft_s
                    s[4] += r.stats.draft_passes
            if i:
                a, b = (runs[label] for label in labels)
                total += 1
                same += (a.tokens, a.stats.drafted, a.stats.accepted) == (b.tokens, b.stats.drafted, b.stats.accepted)
    return {"sums": sums, "plain": plain, "same": same, "total": total}
