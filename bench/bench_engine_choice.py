"""The first-load comparison of engines (engine/fastest.py) as the worker runs it, on the built-in pairs: every
engine here that runs the pair on the CPU, timed turn about; what each decoded, which won, and how long the
comparison added to the load. --runs repeats it (a new comparison each time, the engines loaded once) to show
whether the winner holds.

    python bench/bench_engine_choice.py [--pairs demo chat] [--runs 2] [--home work-data/bench-home]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", nargs="+", default=["demo", "chat"], choices=["demo", "chat"])
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--home", type=Path, default=ROOT / "work-data" / "bench-home",
                   help="the app folder: llama.cpp's calibration and the unpacked GGUF are kept there between runs")
    args = p.parse_args(argv)
    os.environ["DFLASH_DESKTOP_HOME"] = str(args.home)
    from engine import chat_pair, fastest
    from engine.backends import ENGINES, load_pair
    from engine.bench import DEMO_DIR, machine_line
    from engine.worker import _close
    print(f"# {machine_line()}; load average {os.getloadavg()[0]:.2f} at the start; {time.strftime('%Y-%m-%d %H:%M')}")
    for name in args.pairs:
        target, draft = ((DEMO_DIR / "target", DEMO_DIR / "draft") if name == "demo" else
                         (chat_pair.gguf_path(), ROOT / "assets" / "chat" / "draft"))
        first = fastest.Candidate("llamacpp", "cpu", None)
        cands = fastest.candidates(first, "cpu", target, draft)
        held = {c.engine: load_pair(c.engine, target, draft, device=c.device, dtype=c.dtype) for c in cands}
        print(f"\n## {name} pair: {', '.join(ENGINES[c.engine].label for c in cands)}")
        print("| run | " + " | ".join(f"{ENGINES[c.engine].label} tok/s (how)" for c in cands)
              + " | winner | seconds |")
        print("|---|" + "---|" * (len(cands) + 2))
        for run in range(args.runs):
            # the engines stay loaded between runs: each run is one comparison, loads left out of its seconds
            start = time.perf_counter()
            pair, chosen, result = fastest.compare(held[cands[0].engine], cands, lambda c: held[c.engine],
                                                   lambda pair: None, together=True)
            seconds = time.perf_counter() - start
            cells = []
            for c in cands:
                r = result["rates"].get(c.engine)
                cells.append("—" if r is None else f"{r['tok_s']:.1f} ({r['how']}"
                             + (", first answer only)" if r.get("first_answer_only") else ")"))
            print(f"| {run + 1} | " + " | ".join(cells) + f" | {ENGINES[chosen.engine].label} | {seconds:.1f} |")
        print(f"\nreason (last run): {result['reason']}")
        for pair in held.values():
            _close(pair)
    print(f"\n# load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
