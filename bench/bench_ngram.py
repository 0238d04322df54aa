"""Which of llama.cpp's n-gram lookups pays on this computer, and with what key and draft lengths: SmolLM2's Q4_1
GGUF (the wheel's) answering an edit of pasted code and a request to continue code, greedy, 128 tokens, on a new
server per answer (ngram-mod remembers earlier answers; a new server measures a first answer). Each variant
answers each prompt once per round, the variants taking turns; the best of the rounds is kept.

    python bench/bench_ngram.py [--rounds 2] [--max-new-tokens 128]

The engine's choice (engine/backends/llamacpp/server.py NGRAM_MATCH, NGRAM_MIN) comes from this table.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from engine import chat_pair  # noqa: E402
from engine.backends.llamacpp.calibrate import CHAT_PROMPTS  # noqa: E402
from engine.backends.llamacpp.engine import load_pair  # noqa: E402
from engine.backends.llamacpp.server import Launch, Server, request_body  # noqa: E402
from engine.bench import machine_line  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402

CODE = ("Continue this code:\nclass Inventory:\n    def add(self, name, count):\n"
        "        self.items[name] = self.items.get(name, 0) + count\n\n    def remove(self, name, count):\n"
        "        self.items[name] = self.items.get(name, 0) - count\n\n    def")


@dataclass(frozen=True)
class Variant(Launch):
    """A plain server's launch with llama.cpp's own speculation flags added."""
    extra: tuple = ()

    def args(self, port, key_file):
        return super().args(port, key_file) + list(self.extra)


def variants(base: Variant) -> dict[str, Variant]:
    def spec(kind, longest, **flags):
        extra = ("--spec-type", kind, "--spec-draft-n-max", str(longest))
        for flag, value in flags.items():
            extra += (f"--spec-{kind}-{flag.replace('_', '-')}", str(value))
        return replace(base, extra=extra)
    return {"plain": base,
            "ngram-mod 24/48/64 (llama.cpp's defaults)": spec("ngram-mod", 64),
            "ngram-mod 16/8/64": spec("ngram-mod", 64, n_match=16, n_min=8, n_max=64),
            "ngram-mod 4/2/8": spec("ngram-mod", 8, n_match=4, n_min=2, n_max=8),
            "ngram-mod 4/2/16 (ours, request cap 8)": spec("ngram-mod", 16, n_match=4, n_min=2, n_max=16),
            "ngram-simple n4 m8": spec("ngram-simple", 8, size_n=4, size_m=8),
            "ngram-simple n12 m48 (defaults)": spec("ngram-simple", 48),
            "ngram-map-k n4 m8": spec("ngram-map-k", 8, size_n=4, size_m=8)}


def answer(launch: Variant, warm: list[int], prompt: list[int], tokens: int, cap: int | None) -> dict:
    server = Server(launch)
    try:
        for _ in server.stream(request_body(warm, GenerationSettings(max_new_tokens=8))):
            pass
        body = request_body(prompt, GenerationSettings(max_new_tokens=tokens))
        if cap:
            body["speculative.n_max"] = cap
        last = {}
        for event in server.stream(body):
            last = event
        t = last["timings"]
        return {"tok_s": t["predicted_n"] / (t["predicted_ms"] / 1000), "drafted": t.get("draft_n", 0),
                "accepted": t.get("draft_n_accepted", 0)}
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    print(machine_line(), time.strftime("%Y-%m-%d %H:%M"), flush=True)
    pair = load_pair(chat_pair.gguf_path())
    tok = pair.tokenizer
    prompts = {"edit": tok.encode_prompt(CHAT_PROMPTS[2]), "code": tok.encode_prompt(CODE)}
    warm = tok.encode_prompt("Say hello.")
    base = Variant(**{f: getattr(pair.base, f) for f in Launch.__dataclass_fields__}, extra=())
    base = replace(base, flash_attn="off")
    pair.close()
    best: dict[tuple[str, str], dict] = {}
    for r in range(args.rounds):
        order = list(variants(base).items())
        for name, launch in (order if r % 2 == 0 else order[::-1]):
            for kind, prompt in prompts.items():
                result = answer(launch, warm, prompt, args.max_new_tokens, 8 if "request cap" in name else None)
                if (name, kind) not in best or result["tok_s"] > best[name, kind]["tok_s"]:
                    best[name, kind] = result
    for kind in prompts:
        plain = best["plain", kind]["tok_s"]
        for name in variants(base):
            r = best[name, kind]
            print(f"{kind:5s} {name:42s} {r['tok_s']:7.1f} tok/s  {r['tok_s'] / plain:5.2f}x  drafted {r['drafted']:4d}  "
                  f"accepted {r['accepted']:4d}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
