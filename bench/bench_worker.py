"""What the worker process costs: decode tok/s through the worker (measured where the GUI sees the
events) against the same generation in-process, and a cold start from spawn to first token.

    python bench/bench_worker.py [--repeats 7] [--tokens 128] [--threads 1] [--device cpu] [--json PATH]

Uses assets/demo/{target,draft} when present, else a random pair written to a temporary folder.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PROMPT = ("Speculative decoding lets a small drafter propose several tokens that the large model then checks "
          "in one pass. Explain, step by step, why the output stays exactly the same as plain decoding.\n")


def pick_pair(tmp: Path, hidden: int, layers: int) -> tuple[str, str, str]:
    demo = ROOT / "assets" / "demo"
    if (demo / "target" / "config.json").is_file() and (demo / "draft" / "config.json").is_file():
        return str(demo / "target"), str(demo / "draft"), "assets/demo"
    from tests.tiny_torch import save_random_pair
    target, draft = save_random_pair(tmp, block_size=16, hidden=hidden, layers=layers, draft_layers=2)
    return str(target), str(draft), f"random qwen3 (hidden {hidden}, {layers} layers, byte vocab)"


class Recorder:
    """Client callback: arrival time of each request's first token chunk and of its end."""

    def __init__(self):
        self.first: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.hello = self.loaded = None
        self.cond = threading.Condition()

    def __call__(self, ev: dict) -> None:
        now, rid = time.perf_counter(), ev.get("id")
        if ev["event"] == "tokens":
            self.first.setdefault(rid, now)
        elif ev["event"] == "hello":
            self.hello = now
        elif ev["event"] == "loaded":
            self.loaded = now
        elif ev["event"] in ("done", "error"):
            self.end[rid] = now


def in_process(pair, ids, settings) -> float:
    from engine.loop import Generation
    gen = Generation(pair, ids, settings)
    first = None
    for _ in gen:
        first = first or time.perf_counter()
    return (len(gen.tokens) - 1) / (time.perf_counter() - first)


def through_worker(client, rec, ids, settings_dict) -> tuple[float, dict]:
    rid = client.generate(prompt_ids=ids, settings=settings_dict)
    done = client.wait(rid, 600)
    assert done["event"] == "done", done
    return (len(done["token_ids"]) - 1) / (rec.end[rid] - rec.first[rid]), done


def pipe_cost_us(n: int = 20000) -> float:
    """Microseconds per token event for encode + pipe + readline + decode: the worker's whole transport
    cost, measured without a model so the shared machine's noise barely touches it."""
    from engine import protocol as P
    event = {"event": "tokens", "id": "generate-7", "spans": [["word", True]], "tokens": [1234],
             "drafted": [True], "steps": [[15, 3]], "generated": 100, "elapsed_s": 1.2345}
    r, w = os.pipe()
    got = []
    reader = threading.Thread(target=lambda: got.extend(P.decode(line) for line in os.fdopen(r, "rb")))
    reader.start()
    out = os.fdopen(w, "wb", buffering=0)
    t0 = time.perf_counter()
    for _ in range(n):
        out.write(P.encode(event))
    out.close()
    reader.join()
    assert len(got) == n
    return (time.perf_counter() - t0) / n * 1e6


def cold_start(target, draft, device, ids) -> dict:
    from dflash_desktop.worker_client import WorkerClient
    rec = Recorder()
    t0 = time.perf_counter()
    client = WorkerClient(on_event=rec)
    loaded = client.wait(client.load_pair(target, draft, device=device), 600)
    assert loaded["event"] == "loaded", loaded
    rid = client.generate(prompt_ids=ids, settings={"max_new_tokens": 1})
    client.wait(rid, 600)
    client.shutdown(10)
    return {"hello_s": rec.hello - t0, "loaded_s": rec.loaded - t0, "first_token_s": rec.first[rid] - t0,
            "load_s_in_worker": loaded["load_s"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="torch threads for both sides (OMP_NUM_THREADS)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch; the worker inherits it
    os.environ.setdefault("DFLASH_DESKTOP_HOME", tempfile.mkdtemp(prefix="bench-worker-home-"))

    cold = None
    with tempfile.TemporaryDirectory() as tmp:
        import torch
        from dflash_desktop.worker_client import WorkerClient
        from engine.bench import machine_line
        from engine.limits import GenerationSettings
        from engine.backends.torch.engine import load_pair
        target, draft, source = pick_pair(Path(tmp), args.hidden, args.layers)
        pair = load_pair(target, draft, device=args.device)
        ids = pair.tokenizer.encode_prompt(PROMPT, raw=True)
        settings = {"max_new_tokens": args.tokens}
        gs = GenerationSettings(**settings)

        cold = cold_start(target, draft, args.device, ids)   # first: nothing cached in a worker yet
        rec = Recorder()
        client = WorkerClient(on_event=rec)
        client.wait(client.load_pair(target, draft, device=args.device), 600)
        in_process(pair, ids, GenerationSettings(max_new_tokens=8))          # warm both sides
        through_worker(client, rec, ids, {"max_new_tokens": 8})
        local, remote, inner = [], [], []
        for _ in range(args.repeats):   # interleaved, so load from other processes hits both alike
            local.append(in_process(pair, ids, gs))
            tok_s, done = through_worker(client, rec, ids, settings)
            remote.append(tok_s)
            inner.append(done["stats"]["decode_tok_s"])
        client.shutdown(10)
    pipe_us = pipe_cost_us()

    result = {
        "machine": machine_line(), "date": time.strftime("%Y-%m-%d"), "pair": source, "device": args.device,
        "threads": torch.get_num_threads(), "tokens": args.tokens, "repeats": args.repeats,
        "in_process_tok_s": statistics.median(local), "worker_tok_s": statistics.median(remote),
        "worker_internal_tok_s": statistics.median(inner),
        # each worker run against the in-process run just before it: drift on a shared machine cancels
        "overhead_pct": 100.0 * (1 - statistics.median(r / here for r, here in zip(remote, local))),
        "transport_overhead_pct": 100.0 * (1 - statistics.median(r / i for r, i in zip(remote, inner))),
        "runs": {"in_process": local, "worker": remote}, "cold_start": cold,
        "pipe_us_per_event": pipe_us,
        "pipe_pct_at_in_process_rate": pipe_us * 1e-6 * statistics.median(local) * 100.0,
        "command": "python bench/bench_worker.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    print(f"{result['machine']}\npair: {source}, device {args.device}, {args.tokens} new tokens, "
          f"median of {args.repeats}")
    print(f"{'':28}{'tok/s':>10}")
    print(f"{'in-process':28}{result['in_process_tok_s']:10.1f}")
    print(f"{'worker (seen by client)':28}{result['worker_tok_s']:10.1f}")
    print(f"{'worker (engine stats)':28}{result['worker_internal_tok_s']:10.1f}")
    print(f"{'overhead vs in-process':28}{result['overhead_pct']:9.1f}%  (median of paired ratios)")
    print(f"{'pipe + JSON alone':28}{result['transport_overhead_pct']:9.1f}%  (client-seen vs engine stats)")
    print(f"{'pipe cost per token event':28}{pipe_us:9.1f} us = {result['pipe_pct_at_in_process_rate']:.3f}% of "
          "decode time at the in-process rate")
    print(f"cold start: hello {cold['hello_s']:.2f} s, pair loaded {cold['loaded_s']:.2f} s, "
          f"first token {cold['first_token_s']:.2f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
