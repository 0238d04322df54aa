"""Chat logic without widgets: what to send for a conversation, the baseline calibration record, and
the plain-language diagnosis when DFlash is not paying off. Kept Qt-free so it is easy to test."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from engine.backends import METHODS

CALIBRATION_PROMPT = "def parse_arguments(argv):\n    \"\"\"Parse command line arguments.\"\"\"\n"
CALIBRATION_TOKENS = 64
CALIBRATION_RUNS = 3     # the baseline is the median run: one run is one draw from a machine that may be busy
LOW_TAU = 1.5


@dataclass
class BaselineRecord:
    """Plain decoding speed of the target, measured here, so the speedup compares like with like.

    The one source of truth for "this pair's baseline on this machine": the chat's calibration and the
    speedup demo's plain run both write it (PairSession.record_baseline), and every figure derived
    from it (speedup, warnings) is recomputed when it changes."""
    tok_s: float                    # decode tokens per second (the first token, prefill, excluded)
    tokens: int
    measured_at: float
    device: str
    method: str = "calibration"     # "calibration" (64 tokens of a fixed prompt) or "speedup demo"
    cpu_other: float | None = None  # share of the machine's CPU other programs used meanwhile (0-1; the most of any run)
    runs: list[float] = field(default_factory=list)   # tok/s of each run it is the median of (empty: one run)

    @classmethod
    def from_done(cls, done: dict, device: str, method: str = "calibration",
                  cpu_other: float | None = None) -> "BaselineRecord":
        stats = done.get("stats") or {}
        return cls(float(stats.get("decode_tok_s") or 0.0), int(stats.get("generated_tokens") or 0),
                   time.time(), device, method, cpu_other)

    @classmethod
    def median_of(cls, runs: list[tuple[dict, float | None]], device: str, method: str = "calibration"):
        """The median of several runs (done event, other programs' CPU share), keeping every run's speed and the
        busiest share."""
        rates = [float((done.get("stats") or {}).get("decode_tok_s") or 0.0) for done, _ in runs]
        middle = sorted(range(len(runs)), key=rates.__getitem__)[len(runs) // 2]
        shares = [cpu for _, cpu in runs if cpu is not None]
        record = cls.from_done(runs[middle][0], device, method, max(shares) if shares else None)
        record.runs = rates if len(runs) > 1 else []
        return record

    @classmethod
    def from_dict(cls, raw: dict | None) -> "BaselineRecord | None":
        try:
            cpu = raw.get("cpu_other")
            return cls(float(raw["tok_s"]), int(raw["tokens"]), float(raw["measured_at"]), str(raw["device"]),
                       str(raw.get("method") or "calibration"), None if cpu is None else float(cpu),
                       [float(r) for r in raw.get("runs") or []])
        except (TypeError, KeyError, ValueError, AttributeError):
            return None

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """'Baseline 41 tok/s — plain decoding of the same target, measured today 14:02 on this CPU, 64 tokens
        (calibration run); other programs used 3% of the CPU meanwhile.'"""
        when = time.localtime(self.measured_at)
        today = time.localtime()
        day = "today" if when[:3] == today[:3] else time.strftime("on %d %b", when)
        where = "this CPU" if self.device.startswith("cpu") else f"this {self.device.split(':')[0].upper()} device"
        how = "calibration" if self.method == "calibration" else f"plain run of the {self.method}"
        if len(self.runs) > 1:
            how = (f"{how}: the median of {len(self.runs)} runs, {min(self.runs):.0f}–{max(self.runs):.0f} "
                   "tok/s")
        elif self.method == "calibration":
            how = "calibration run"
        text = (f"Baseline {self.tok_s:.0f} tok/s — plain decoding of the same target, measured {day} "
                f"{time.strftime('%H:%M', when)} on {where}, {self.tokens} tokens ({how})")
        if self.cpu_other is not None:
            text += f"; other programs used {self.cpu_other:.0%} of the CPU meanwhile"
        return text + "."


BUSY_SHARE = 0.25        # other programs using a quarter of the CPU capacity slow a CPU decode noticeably
REPEAT_SHARE = 0.5       # half the tokens repeating earlier text: drafts of it are easy, not representative
REPEAT_NGRAM = 4
MIN_CPU_WALL_S = 0.5     # CPU time is counted in 10 ms ticks: judge a busy machine over half a second or more


METHOD_WORDS = {"dflash": "DFlash", "plain": "plain decoding", "server": "the server's own decoding"}


def method_of(stats: dict | None) -> str | None:
    """How a stored answer was decoded (engine.stats.Stats.method); answers stored before the engine said so
    are read from their counts by the same rule. None without stats."""
    if not stats:
        return None
    if stats.get("method"):
        return str(stats["method"])
    if stats.get("block_size") == 0:
        return "server"
    drafted_known = "drafted" not in (stats.get("unknown") or ())
    return "plain" if stats.get("block_size") == 1 or (stats.get("drafted") == 0 and drafted_known) else "dflash"


def method_words(stats: dict | None) -> str | None:
    """"DFlash", "n-gram lookup", "plain decoding", "DFlash, then plain decoding" (the fallback switched
    mid-answer)…: the speculation method by name where the answer drafted."""
    method = method_of(stats)
    if method == "dflash":
        name = METHODS.get(stats.get("speculation") or "dflash", "DFlash")
        return f"{name}, then plain decoding" if (stats.get("fallback") or {}).get("after_tokens") else name
    return METHOD_WORDS.get(method or "")


def author_text(stats: dict | None, writer: str | None = None) -> str:
    """The answer's header: the model that wrote it and how it decoded ("SmolLM2-135M-Instruct  ·  plain
    decoding"), from the answer's own stats; ``writer``: the loaded model's name while it is being written."""
    name = ((stats or {}).get("model") or {}).get("name") or writer or "Assistant"
    words = method_words(stats)
    return f"{name}  ·  {words}" if words else name


def speedup(stats: dict | None, baseline: BaselineRecord | None) -> float | None:
    if not stats or not baseline or baseline.tok_s <= 0:
        return None
    rate = float(stats.get("decode_tok_s") or 0.0)
    return rate / baseline.tok_s if rate > 0 else None


def repetition_share(token_ids: list[int] | None = None, text: str = "") -> float:
    """Share of the output that repeats earlier output: tokens whose preceding 4-gram (with them) already
    occurred (by token ids; by characters of whole lines when no ids are known). 0 for short outputs."""
    if token_ids and len(token_ids) >= 4 * REPEAT_NGRAM:
        seen, repeated = set(), 0
        for i in range(REPEAT_NGRAM - 1, len(token_ids)):
            gram = tuple(token_ids[i - REPEAT_NGRAM + 1: i + 1])
            repeated += gram in seen
            seen.add(gram)
        return repeated / len(token_ids)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 4:
        return 0.0
    seen_lines, repeated_chars = set(), 0
    for line in lines:
        if line in seen_lines:
            repeated_chars += len(line)
        seen_lines.add(line)
    return repeated_chars / sum(len(line) for line in lines)


def looks_like_prose(text: str) -> bool:
    """English sentences rather than code: mostly letters and spaces, few code symbols."""
    text = text.strip()
    if len(text) < 8:
        return False
    code = sum(text.count(ch) for ch in "()[]{}=:_#;<>\"\'")
    words = text.split()
    return code / len(text) < 0.03 and len(words) >= 3 and sum(w.isalpha() for w in words) / len(words) > 0.6


def diagnose(stats: dict | None, baseline: BaselineRecord | None, has_drafter: bool = True,
             context: dict | None = None) -> str | None:
    """Sentences when DFlash is not helping (or when its speedup is not representative), None when all is well
    or there is too little to judge. Every reason comes from a measurement.

    context (all optional): `cpu_other` (share of the CPU other programs used during the answer),
    `token_ids` / `text` (the answer), `prompt` (the last user turn), `chat_template` (bool),
    `thinking_mismatch` (thinking switched away from the drafter's training) and `drafter_training` (the
    catalog's words on a drafter trained on little data)."""
    context = context or {}
    if not stats or int(stats.get("generated_tokens") or 0) < 8:
        return None
    if not has_drafter:
        return "No drafter is loaded: this is plain decoding, without DFlash."
    if stats.get("fallback"):
        return (f"{stats['fallback']['reason']} The text is the same either way. (Settings: Plain fallback "
                "turns this off.)")
    if method_of(stats) == "plain":
        return ("Plain decoding: nothing was drafted in this answer (block size 1), so it has no acceptance or "
                "speedup to judge.")
    tau = float(stats.get("tau") or 0.0)
    rate = float(stats.get("acceptance_rate") or 0.0)
    ratio = speedup(stats, baseline)
    name = METHODS.get(stats.get("speculation") or "dflash", "DFlash")   # the method that drafted
    reasons: list[str] = []
    if tau and tau < LOW_TAU:
        reasons.append(f"Low acceptance: the target kept {rate:.0%} of the drafted tokens, {tau:.2f} tokens per "
                       f"pass. {_likely_cause(context)}")
    cpu = context.get("cpu_other")
    if cpu is not None and (context.get("cpu_wall_s") or MIN_CPU_WALL_S) < MIN_CPU_WALL_S:
        cpu = None   # a run of a few ticks: too short for the share to mean anything
    if cpu is not None and cpu >= BUSY_SHARE:
        reasons.append(f"A busy machine: other programs used {cpu:.0%} of the CPU while this answer was written, "
                       "so the engine got less of it.")
    if ratio is not None and ratio < 1.0:
        base_cpu = baseline.cpu_other if baseline else None
        if base_cpu is not None and cpu is not None and cpu >= BUSY_SHARE > base_cpu:
            pass   # said above: the baseline ran on a quiet machine, this answer did not
        elif base_cpu is not None and base_cpu >= BUSY_SHARE:
            reasons.append(f"The baseline itself was measured while other programs used {base_cpu:.0%} of the "
                           "CPU: Re-measure on a quiet machine.")
        steps, decode_s = int(stats.get("steps") or 0), float(stats.get("decode_s") or 0.0)
        if not reasons and steps and decode_s > 0 and baseline and baseline.tok_s > 0:
            step_ms, plain_ms = 1000 * decode_s / steps, 1000 / baseline.tok_s
            reasons.append(f"A step too costly here: each {name} step (draft + verify) took {step_ms:.1f} ms, "
                           f"{step_ms / plain_ms:.1f}× a plain step ({plain_ms:.1f} ms), but committed only "
                           f"{tau:.2f} tokens. A smaller block size or a GPU lowers the cost of a step.")
        head = f"{name} ran slower than plain decoding ({ratio:.2f}×). Why, from this answer's measurements:"
        return " ".join([head, *reasons]) if reasons else head
    if ratio is not None and ratio >= 1.0:
        share = repetition_share(context.get("token_ids"), context.get("text") or "")
        if share >= REPEAT_SHARE:
            reasons.append(f"This speedup ({ratio:.2f}×) comes from repetition: {share:.0%} of the answer repeats "
                           "its own earlier text, which the drafter predicts easily. Expect less on varied text.")
    return " ".join(reasons) or None


def _likely_cause(context: dict) -> str:
    if context.get("thinking_mismatch"):
        return "Likely cause: chat mode — thinking is switched away from how this drafter was trained."
    if context.get("chat_template") is False and looks_like_prose(context.get("prompt") or ""):
        return ("Likely cause: the prompt is prose, but this is a code completion model — give it the start of "
                "a Python file.")
    if context.get("chat_template") and context.get("drafter_training"):
        return (f"Likely cause: a drafter with little training: {context['drafter_training']}. Published drafters "
                "learn from hundreds of thousands of answers; acceptance rises with more training, not with "
                "another prompt.")
    if context.get("chat_template") and looks_like_prose(context.get("prompt") or ""):
        return ("Likely cause: prose; drafters are usually trained on code and maths answers and accept fewer "
                "tokens of free text.")
    return ("Likely cause: a prompt format unlike the drafter's training data (another language, another "
            "template), or a drafter that does not match this target.")


def calibration_agreement(choice: dict | None, ratio: float) -> str:
    """What the speedup demo's ratio on one prompt says about the engine's calibrated choice (llama.cpp measures
    plain decoding against each way it can speculate on a few prompts when a pair loads): they agree, or why
    they may not."""
    by_method = (choice or {}).get("by_method") or {}
    if "none" not in by_method or len(by_method) < 2:
        return ""
    method, n_max = choice.get("method", "none"), int(choice.get("n_max") or 0)
    over = f" over {choice['prompts']} prompts" if choice.get("prompts", 1) > 1 else ""
    others = [f"{METHODS.get(m, m)} at {r['tok_s']:.0f} tok/s at its best ({r['n_max']} drafts per step)"
              for m, r in by_method.items() if m != "none"]
    measured = (f"the calibration at load measured plain decoding at {by_method['none']['tok_s']:.0f} tok/s and "
                f"{' and '.join(others)}{over}")
    chose = f"{METHODS.get(method, method)} with {n_max} drafts per step" if method != "none" else "plain decoding"
    if (ratio >= 1) == (method != "none"):
        return f"This agrees with the engine's choice of {chose}: {measured}."
    if method == "none":
        chose += ", which answers keep using"
    return (f"The engine chose {chose}: {measured}. One prompt can favour what the mix of prompts does not, and a "
            "busy moment can move either figure.")


def request_for(messages: list[dict], system_prompt: str, has_chat_template: bool) -> dict:
    """generate() keywords for a conversation: chat messages when the model has a template, otherwise the
    conversation as one raw prompt without the system prompt (the demo model continues code; it has no roles)."""
    turns = [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] in ("user", "assistant")]
    if has_chat_template:
        sys_turn = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
        return {"messages": sys_turn + turns}
    # no roles, so no system prompt either: the window disables the field and says why (a system prompt
    # pasted in front of the code would only be continued as if it were code)
    return {"prompt": "".join(t["content"] for t in turns)}


def title_from(text: str, limit: int = 48) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"
