"""Two checkouts of the app, the same demo pair, one run: plain decoding and DFlash through each checkout's
own worker process, alternating prompt by prompt, the sides taking turns to go first (this machine's speed
drifts by 10-30% within minutes, so separate runs cannot compare them). Numbers come from each worker's `done` stats, so both sides are
measured by their own code, the way the window sees them.

    git worktree add --detach /tmp/before <commit>
    python bench/bench_ab_checkouts.py /tmp/before [--after .] [--engine llamacpp] [--limit 20] [--max-new-tokens 256]

Each worker is driven over its pipes directly, with only the commands both versions speak (no hello, no
new settings; `engine` only when --engine names one), so the "after" side runs with its defaults, plain
fallback included.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from engine.bench import DEMO_DIR, demo_prompts, machine_line  # noqa: E402

TERMINAL = {"loaded", "done", "error", "ok"}


class Worker:
    """One checkout's worker process, one request at a time, over its stdin and stdout."""

    def __init__(self, checkout: Path):
        env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONIOENCODING": "utf-8"}
        self.proc = subprocess.Popen([sys.executable, "-m", "engine.worker"], cwd=checkout, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.ids = iter(range(1, 1 << 30))

    def ask(self, cmd: str, **fields) -> dict:
        rid = f"{cmd}-{next(self.ids)}"
        self.proc.stdin.write((json.dumps({"cmd": cmd, "id": rid, **fields}) + "\n").encode())
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            event = json.loads(line)
            if event.get("id") == rid and event["event"] in TERMINAL:
                return event
        raise RuntimeError(f"the worker of {cmd} exited")

    def close(self) -> None:
        self.ask("shutdown")
        self.proc.wait(10)


def start(checkout: Path, engine: str | None) -> Worker:
    worker = Worker(checkout)
    loaded = worker.ask("load_pair", target=str(DEMO_DIR / "target"), draft=str(DEMO_DIR / "draft"), device="cpu",
                        **({"engine": engine} if engine else {}))
    assert loaded["event"] == "loaded", loaded
    return worker


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path, help="checkout of the earlier version")
    ap.add_argument("--after", type=Path, default=ROOT)
    ap.add_argument("--engine", help="the engine both sides load the pair with (default: each side's default)")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(DEMO_DIR / "target" / "tokenizer.json"))
    prompts = [tok.encode(text, add_special_tokens=False).ids for _, text in demo_prompts(args.limit)]
    sides = {"before": start(args.before.resolve(), args.engine), "after": start(args.after.resolve(), args.engine)}
    keys = [(side, mode) for side in sides for mode in ("baseline", "dflash")]
    tokens, seconds = dict.fromkeys(keys, 0), dict.fromkeys(keys, 0.0)
    decode_tokens, decode_s = dict.fromkeys(keys, 0), dict.fromkeys(keys, 0.0)
    identical, fallbacks = 0, 0
    settings = {"max_new_tokens": args.max_new_tokens}
    for i, ids in enumerate([prompts[0]] + prompts):     # the first prompt twice: the first round warms up
        outputs = set()
        # the sides take turns going first, prompt by prompt: whichever runs second would otherwise always meet
        # the machine a moment later (a warmer cache, another program's burst)
        order = keys if i % 2 else [(side, mode) for side in reversed(list(sides)) for mode in ("baseline", "dflash")]
        for side, mode in order:
            done = sides[side].ask("generate", prompt_ids=ids, settings=settings, mode=mode)
            assert done["event"] == "done", done
            s = done["stats"]
            outputs.add(tuple(done["token_ids"]))
            if i:
                tokens[(side, mode)] += s["generated_tokens"]
                seconds[(side, mode)] += s["ttft_s"] + s["decode_s"]
                decode_tokens[(side, mode)] += s["generated_tokens"] - 1
                decode_s[(side, mode)] += s["decode_s"]
                fallbacks += bool(s.get("fallback"))
        identical += i > 0 and len(outputs) == 1
    for worker in sides.values():
        worker.close()
    rate = {k: tokens[k] / seconds[k] for k in keys}
    decode = {k: decode_tokens[k] / decode_s[k] for k in keys}
    print(machine_line())
    print(f"{'checkout':<8}{'mode':<10}{'tok/s':>9}{'decode tok/s':>14}")
    for side, mode in keys:
        print(f"{side:<8}{mode:<10}{rate[(side, mode)]:>9.1f}{decode[(side, mode)]:>14.1f}")
    for side in sides:
        print(f"{side}: DFlash over plain {rate[(side, 'dflash')] / rate[(side, 'baseline')]:.2f}x end to end, "
              f"{decode[(side, 'dflash')] / decode[(side, 'baseline')]:.2f}x decoding only")
    for mode in ("baseline", "dflash"):
        print(f"after over before, {mode}: {rate[('after', mode)] / rate[('before', mode)]:.3f}x end to end")
    print(f"all four outputs identical on {identical}/{len(prompts)} prompts; plain fallbacks (after): {fallbacks}")
    if args.json:
        args.json.write_text(json.dumps({"tok_s": {f"{s}/{m}": v for (s, m), v in rate.items()},
                                         "decode_tok_s": {f"{s}/{m}": v for (s, m), v in decode.items()},
                                         "identical": identical, "prompts": len(prompts), "fallbacks": fallbacks,
                                         "engine": args.engine or "default",
                                         "machine": machine_line(), "date": time.strftime("%Y-%m-%d")}, indent=2))
    return 0 if identical == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
