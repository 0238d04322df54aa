"""Which engine decodes a pair fastest on this computer, measured. Where more than one engine built here runs the
pair's files on the device it loads on (PyTorch, MLX and llama.cpp on a CPU; on an NVIDIA GPU torch's CUDA path
and a GPU build of llama.cpp), the first load times each engine's own answers to the same greedy prompts: its own
speculation choice and its plain fallback, as a user's answers run. The engines take turns, prompt by prompt, so a
busy moment slows them alike, and the best total over every prompt wins. An engine far slower than the others in a
first short answer is not timed at all; an answer that takes longer than half the fastest speed seen allows is cut
there, and an engine at less than half the fastest one's speed after a round is not timed again, so one slow engine
never holds a first load for minutes. The result is remembered in the app's cache, keyed by the files, the device, the engines and the
machine, so a pair is compared once; it says in words why the others lost."""
from __future__ import annotations

import hashlib
import os
import platform
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Callable

from .backends import ENGINES, METHODS, device_class_of
from .backends.choice import fits_in_memory, runners
from .backends.llamacpp.calibrate import answer_tokens
from .cache_dir import files_id, read_record, write_record
from .errors import Cancelled, EngineError
from .limits import GenerationSettings
from .loop import Generation, StepCosts
from .machine import cpu_model

# Prompts of their own, not the calibration's: llama.cpp's n-gram lookup remembers the text its server has seen,
# so an answer it wrote before drafts itself. Each round has its own (a chat model's requests, a code model's
# openings), and the warm-up too: no engine answers one prompt twice.
CHAT_ROUNDS = (("Write a short, friendly email inviting a colleague to a team lunch on Friday.",
                "What are three practical ways to reduce food waste at home? Explain each briefly.",
                "Write a Python function that counts how often each word appears in a text file and returns the ten "
                "most common words."),
               ("Summarize the main causes of the French Revolution in one paragraph.",
                "Explain what a hash table is and when you would use one, with a small example in Python.",
                "Give me a three-day plan for learning the basics of SQL."))
CODE_ROUNDS = (('import csv\n\n\ndef read_rows(path):\n    """Return the rows of the CSV file at path as dictionaries '
                'keyed by its header."""\n',
                'class Stack:\n    """A last-in, first-out stack backed by a list."""\n\n    def __init__(self):\n',
                'def binary_search(items, target):\n    """Return the index of target in the sorted list items, or '
                '-1."""\n'),
               ('import re\n\n\ndef slugify(title):\n    """Lowercase the title and replace each run of other '
                'characters than letters and digits with a dash."""\n',
                'from dataclasses import dataclass\n\n\n@dataclass\nclass Point:\n    """A point in the plane."""\n\n'
                '    x: float\n    y: float\n\n    def distance(self, other):\n',
                'def fibonacci(n):\n    """Return the first n Fibonacci numbers as a list."""\n'))
WARM_UP = ("Name a colour.", "def add(a, b):\n")
ROUNDS = len(CHAT_ROUNDS)
KEEP_SHARE = 0.5       # an engine below this share of the fastest one's speed after a round is not timed again
WARM_TOKENS = 16       # a first short answer on each engine: compiled steps, caches and servers warm up
WARM_LIMIT_S = 4.0     # ... cut short after this many seconds: an engine that slow is not timed further anyway
WARM_SHARE = 0.2       # an engine below this share of the fastest one's speed in that answer is not timed at all
PROMPT_S = 1.0         # what a timed answer's limit allows beyond its tokens at KEEP_SHARE of the fastest speed


@dataclass(frozen=True)
class Candidate:
    engine: str
    device: str            # the engine's own device name
    dtype: str | None


# the device classes that reach one device: an NVIDIA card is also one that llama.cpp's Vulkan build drives
SAME_DEVICE = {"cuda": ("cuda", "vulkan"), "vulkan": ("vulkan",), "apple": ("apple",), "cpu": ("cpu",)}


def candidates(first: Candidate, device_class: str, target, draft) -> list[Candidate]:
    """The planned engine, then every other engine built here that runs the same files on the same device, each
    in its own default dtype there (the weights a user gets who picks that engine)."""
    out = [first]
    for cls in SAME_DEVICE.get(device_class, (device_class,)):
        for name in runners(target, draft, cls):
            info = ENGINES[name]
            if name in {c.engine for c in out} or cls not in info.devices or not _built_for(name, info.devices[cls]):
                continue
            if cls == "cpu" and not fits_in_memory([name], target, draft):
                continue      # in float32, or a GGUF unpacked, it would not fit in the memory free now
            out.append(Candidate(name, info.devices[cls], info.dtypes.get(cls)))
    return out


def _built_for(engine: str, device: str) -> bool:
    """llama.cpp reaches a GPU only through a GPU build of its server, where one is here."""
    if engine != "llamacpp" or device == "cpu":
        return True
    from .backends.llamacpp import build, gpu
    return any(backend in build.builds() for backend in gpu.BUILDS_FOR.get(device, ()))


STORE = "engine-choice.json"     # in the app's cache


def _engine_version(name: str) -> str:
    """What would make an engine decode at another speed: its library, or for llama.cpp its build."""
    if name == "llamacpp":
        from .backends.llamacpp import build
        return ",".join(f"{backend}:{build.key(backend)}" for backend in sorted(build.builds()))
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


def key(cands: list[Candidate], target, draft) -> str:
    parts = [files_id(target), files_id(draft), platform.machine(), cpu_model(), str(os.cpu_count()),
             *(f"{c.engine} {c.device} {c.dtype} {_engine_version(c.engine)}" for c in sorted(
                 cands, key=lambda c: c.engine)), f"{ROUNDS} rounds of their own prompts, greedy, the engine's own choice"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def remembered(cands: list[Candidate], target, draft) -> dict | None:
    """The choice measured for these files and engines here, if any (and only one naming a candidate)."""
    found = read_record(STORE).get(key(cands, target, draft))
    return found if isinstance(found, dict) and found.get("engine") in {c.engine for c in cands} else None


def remember(cands: list[Candidate], target, draft, result: dict | None) -> None:
    """Keep the result for these files and engines here (None: forget it, to measure again)."""
    saved, k = read_record(STORE), key(cands, target, draft)
    if result is None:
        saved.pop(k, None)
    else:
        saved[k] = result
    write_record(STORE, saved)


def _encoded(pair, chat: str, code: str) -> list[int]:
    tok = pair.tokenizer
    return tok.encode_prompt(chat) if tok.has_template else tok.encode_prompt(code, raw=True)


def _answer(pair, prompt: list[int], tokens: int, costs: StepCosts, limit_s: float | None = None) -> dict:
    """One greedy answer as a user's runs (the engine's own method, its plain fallback), decoding time only;
    limit_s: it stops after the step that passes so many seconds (a very slow engine's first answer)."""
    gen = Generation(pair, prompt, GenerationSettings(max_new_tokens=tokens, temperature=0.0), costs=costs)
    start = time.perf_counter()
    for _ in gen:
        if limit_s is not None and time.perf_counter() - start > limit_s:
            gen.cancel()
    s = gen.stats
    how = ("plain decoding" if s.method == "plain" else
           f"{METHODS.get(s.speculation, s.speculation)}" + (", then plain decoding" if s.fallback else ""))
    return {"tokens": max(s.generated_tokens - 1, 0), "seconds": s.decode_s, "how": how,
            "cut": gen.stop_reason == "cancelled"}


def compare(first_pair, cands: list[Candidate], load: Callable[[Candidate], object], close: Callable[[object], None],
            together: bool, progress: Callable[[str], None] = lambda message: None,
            cancelled: Callable[[], bool] = lambda: False) -> tuple[object, Candidate, dict]:
    """Time the candidates (the first already loaded as first_pair) and return the fastest loaded, its candidate
    and the result to remember. together: all are held at once and take turns prompt by prompt (they fit in
    memory together); otherwise each is timed alone, its rounds in a row, and the winner is loaded again at the
    end if it is not the last. An engine that cannot load the pair, or fails an answer, is left out with its
    reason; only a cancel, or every engine failing, ends the load."""
    rounds = [[_encoded(first_pair, chat, code) for chat, code in zip(c, k)] for c, k in zip(CHAT_ROUNDS, CODE_ROUNDS)]
    prompts = [p for r in rounds for p in r]            # every answer's prompt, by its index
    held = {cands[0].engine: first_pair}
    failed: dict[str, str] = {}
    costs = {c.engine: StepCosts() for c in cands}
    best: dict[tuple[str, int], dict] = {}
    hows: dict[str, str] = {}                  # how each engine's answers ran (its method, a fallback)
    warm_rates: dict[str, float] = {}

    def check() -> None:
        if cancelled():
            raise Cancelled("Loading was cancelled while comparing the engines that run this model here.")

    def drop(name: str, exc: Exception) -> None:
        failed[name] = str(exc) or type(exc).__name__
        close(held.pop(name, None))
        for i in range(len(prompts)):
            best.pop((name, i), None)

    def bring(c: Candidate) -> bool:
        check()
        progress(f"Comparing engines on this computer: loading {ENGINES[c.engine].label}")
        try:
            held[c.engine] = load(c)
        except Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - any engine's failure leaves it out of the comparison
            drop(c.engine, exc)
        return c.engine in held

    def answer(name: str, prompt: list[int], tokens: int, limit_s: float | None = None) -> dict | None:
        check()
        try:
            run = _answer(held[name], prompt, tokens, costs[name], limit_s)
        except Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - as in bring
            drop(name, exc)
            return None
        hows[name] = run["how"]
        return run

    def warm(name: str) -> float:
        """A first short answer: its speed, where it decoded any (an engine far slower than the others is left
        after it: timing it would take most of the wait)."""
        progress(f"Comparing engines on this computer: warming up {ENGINES[name].label}")
        run = answer(name, _encoded(first_pair, *WARM_UP), WARM_TOKENS, WARM_LIMIT_S)
        if run and run["tokens"] and run["seconds"] > 0:
            warm_rates[name] = run["tokens"] / run["seconds"]
        elif run and run["cut"]:
            warm_rates[name] = 0.0        # not one token past the first in the time allowed
        return warm_rates.get(name, 0.0)

    def too_slow(name: str) -> bool:
        return name in warm_rates and warm_rates[name] < WARM_SHARE * max(warm_rates.values())

    def time_rounds(names: list[str], tokens: int, rounds_run: range) -> None:
        for r in rounds_run:
            for j in range(len(rounds[r])):
                i = r * len(rounds[0]) + j
                for name in names[r % len(names):] + names[:r % len(names)]:   # a new order each round
                    if name not in held:
                        continue
                    progress(f"Comparing engines on this computer: timing {ENGINES[name].label} "
                             f"(round {r + 1} of {ROUNDS}, prompt {j + 1} of {len(rounds[r])})")
                    top = max([*warm_rates.values(), *(rate(c.engine) for c in cands)], default=0.0)
                    run = answer(name, prompts[i], tokens, tokens / (KEEP_SHARE * top) + PROMPT_S if top else None)
                    if run:
                        best[name, i] = run

    def rate(name: str) -> float:
        runs = [best[name, i] for i in range(len(prompts)) if (name, i) in best]
        seconds = sum(r["seconds"] for r in runs)
        return sum(r["tokens"] for r in runs) / seconds if seconds > 0 else 0.0

    try:
        if together:
            for c in cands[1:]:
                bring(c)
            for name in list(held):
                warm(name)
            timed = [c.engine for c in cands if c.engine in held and not too_slow(c.engine)]
            # answers sized so that the slowest engine timed takes about the calibration's budget
            tokens = answer_tokens(min((warm_rates.get(n, 0.0) for n in timed), default=0.0), len(prompts))
            for r in range(ROUNDS if timed else 0):
                time_rounds(timed, tokens, range(r, r + 1))
                top = max((rate(n) for n in timed if n in held), default=0.0)
                timed = [n for n in timed if n in held and rate(n) >= KEEP_SHARE * top]
        else:
            tokens = answer_tokens(warm(cands[0].engine), len(prompts))
            for j, c in enumerate(cands):
                if j:
                    for name in list(held):
                        close(held.pop(name))
                    if not bring(c):
                        continue
                    warm(c.engine)
                if c.engine in held and not too_slow(c.engine):
                    time_rounds([c.engine], tokens, range(ROUNDS))
        names = [c.engine for c in cands if any((c.engine, i) in best for i in range(len(prompts)))]
        winner = max(names, key=rate) if names else next(iter(held), None)
        if winner is None:
            raise EngineError(f"No engine here could answer with this model: {' '.join(failed.values())}",
                              code="engine_crashed")
        chosen = next(c for c in cands if c.engine == winner)
        if winner not in held:
            for name in list(held):
                close(held.pop(name))
            progress(f"Comparing engines on this computer: {ENGINES[winner].label} was the fastest; loading it again")
            held[winner] = load(chosen)
    except BaseException:
        for pair in held.values():
            close(pair)
        raise
    for name in [n for n in held if n != winner]:
        close(held.pop(name))
    rates = {n: {"tok_s": round(rate(n), 1), "how": hows[n]} for n in names}
    rates.update({n: {"tok_s": round(r, 1), "how": hows[n], "first_answer_only": True}
                  for n, r in warm_rates.items() if n not in names and n not in failed})
    return held[winner], chosen, decide(winner, rates, cands, failed, prompts=len(prompts), tokens=tokens)


def _speed(tok_s: float) -> str:
    return f"{tok_s:.0f} tokens/s" if tok_s >= 1.5 else "1 token/s" if tok_s >= 0.5 else "under 1 token/s"


def decide(winner: str, rates: dict[str, dict], cands: list[Candidate], failed: dict[str, str], prompts: int,
           tokens: int) -> dict:
    """The result to remember: the fastest engine, what each measured and how its answers ran, and why, in words."""
    label = {n: ENGINES[n].label for n in ENGINES}
    others = [f"{label[n]}'s {_speed(r['tok_s'])} ("
              + ("its first short answer, too slow to time further)" if r.get("first_answer_only") else f"{r['how']})")
              for n, r in rates.items() if n != winner]
    device = next(c.device for c in cands if c.engine == winner)
    if winner in rates and not rates[winner].get("first_answer_only"):
        w = rates[winner]
        reason = (f"{label[winner]} decoded {_speed(w['tok_s'])} ({w['how']})"
                  + (f" against {' and '.join(others)}" if others else "")
                  + f" over {prompts} prompts ({tokens}-token answers) on this computer, so it runs this model"
                  + ("." if winner == cands[0].engine else f" rather than {label[cands[0].engine]}."))
    else:
        reason = f"{label[winner]} runs this model: no other engine here could."
    for n, why in failed.items():
        reason += f" {label[n]} could not run it here: {why}"
    timed = sorted(rates, key=lambda n: -rates[n]["tok_s"])
    summary = (f"Of the engines here, {label[winner]} decoded fastest: " + ", ".join(
        f"{label[n]} {rates[n]['tok_s']:.0f}" + (" (first answer only)" if rates[n].get("first_answer_only") else "")
        for n in timed) + " tokens/s." if len(rates) > 1 else f"{label[winner]} is the one engine here that runs it.")
    return {"engine": winner, "summary": summary, "device": device, "dtype": next(c.dtype for c in cands if c.engine == winner),
            "rates": rates, "failed": failed, "prompts": prompts, "tokens": tokens,
            "device_class": device_class_of(winner, device), "measured": time.strftime("%Y-%m-%d %H:%M"),
            "reason": reason}
