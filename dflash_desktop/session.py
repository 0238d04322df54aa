"""Chat logic without widgets: what to send for a conversation, the baseline calibration record, and
the plain-language diagnosis when DFlash is not paying off. Kept Qt-free so it is easy to test."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

CALIBRATION_PROMPT = "def parse_arguments(argv):\n    \"\"\"Parse command line arguments.\"\"\"\n"
CALIBRATION_TOKENS = 64
LOW_TAU = 1.5


def pair_key(pair: dict | None) -> str:
    """Baselines are per target on this machine: the key is the pair id plus the target folder."""
    if not pair:
        return ""
    return f"{pair.get('id', '')}|{pair.get('target_dir', '')}"


@dataclass
class BaselineRecord:
    """Plain decoding speed of the target, measured here, so the speedup compares like with like."""
    tok_s: float
    tokens: int
    measured_at: float
    device: str

    @classmethod
    def from_done(cls, done: dict, device: str) -> "BaselineRecord":
        stats = done.get("stats") or {}
        return cls(float(stats.get("decode_tok_s") or 0.0), int(stats.get("generated_tokens") or 0),
                   time.time(), device)

    @classmethod
    def from_dict(cls, raw: dict | None) -> "BaselineRecord | None":
        try:
            return cls(float(raw["tok_s"]), int(raw["tokens"]), float(raw["measured_at"]), str(raw["device"]))
        except (TypeError, KeyError, ValueError):
            return None

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """'Baseline 41 tok/s — plain decoding of the same target, measured today 14:02 on this CPU, 64 tokens.'"""
        when = time.localtime(self.measured_at)
        today = time.localtime()
        day = "today" if when[:3] == today[:3] else time.strftime("on %d %b", when)
        where = "this CPU" if self.device.startswith("cpu") else f"this {self.device.split(':')[0].upper()} device"
        return (f"Baseline {self.tok_s:.0f} tok/s — plain decoding of the same target, measured {day} "
                f"{time.strftime('%H:%M', when)} on {where}, {self.tokens} tokens.")


def speedup(stats: dict | None, baseline: BaselineRecord | None) -> float | None:
    if not stats or not baseline or baseline.tok_s <= 0:
        return None
    rate = float(stats.get("decode_tok_s") or 0.0)
    return rate / baseline.tok_s if rate > 0 else None


def diagnose(stats: dict | None, baseline: BaselineRecord | None, has_drafter: bool = True) -> str | None:
    """A sentence when DFlash is not helping, None when it is (or when there is too little to judge)."""
    if not stats or int(stats.get("generated_tokens") or 0) < 8:
        return None
    if not has_drafter:
        return "No drafter is loaded: this is plain decoding, without DFlash."
    if stats.get("fallback"):
        return (f"{stats['fallback']['reason']} The text is the same either way. (Settings: Plain fallback "
                "turns this off.)")
    tau = float(stats.get("tau") or 0.0)
    ratio = speedup(stats, baseline)
    if tau and tau < LOW_TAU:
        return (f"Acceptance collapsed (τ = {tau:.2f}): the drafter is barely helping. Likely causes: a drafter "
                "that does not match this target or chat mode (thinking on/off), or a prompt unlike its "
                "training data (prose, other languages).")
    if ratio is not None and ratio < 1.0:
        return (f"DFlash ran slower than plain decoding ({ratio:.2f}×). The drafter's cost is not repaid at "
                f"τ = {tau:.2f}; try a smaller block size, or plain decoding for this kind of prompt.")
    return None


def request_for(messages: list[dict], system_prompt: str, has_chat_template: bool) -> dict:
    """generate() keywords for a conversation: chat messages when the model has a template, otherwise the
    conversation as one raw prompt (the demo model continues code; it has no roles)."""
    turns = [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] in ("user", "assistant")]
    if has_chat_template:
        sys_turn = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
        return {"messages": sys_turn + turns}
    parts = [system_prompt] if system_prompt.strip() else []
    parts += [t["content"] for t in turns]
    return {"prompt": "".join(parts)}


def title_from(text: str, limit: int = 48) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"
