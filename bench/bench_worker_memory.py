"""What the worker process holds in memory once a pair is loaded (the chat pair, or the code pair, whose target is
a Hugging Face folder): after a first load that compares the
engines (PyTorch, MLX and llama.cpp each load the pair in turn, the losers are closed), and after a second start
that goes straight to the remembered winner. Resident memory (RSS) of the worker and of llama.cpp's server,
read once the load has answered, the load's time, and whether the worker has PyTorch's library mapped.

    python bench/bench_worker_memory.py [--pair chat|demo] [--json PATH]

Runs in a fresh app home (a temporary folder), so the first load compares.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load_once(label: str, pair: str) -> dict:
    import psutil

    from dflash_desktop.worker_client import WorkerClient
    from engine import chat_pair
    from engine.bench import DEMO_DIR
    target, draft = ((chat_pair.gguf_path(), chat_pair.DRAFT_DIR) if pair == "chat" else
                     (DEMO_DIR / "target", DEMO_DIR / "draft"))
    client = WorkerClient()
    try:
        t0 = time.perf_counter()
        ev = client.wait(client.load_pair(target, draft, engine="torch", device="cpu", compare=True), 900)
        if ev["event"] != "loaded":
            raise SystemExit(f"{label}: the load failed: {ev}")
        seconds = time.perf_counter() - t0
        time.sleep(2)                                  # the worker answers, then nothing more runs
        worker = psutil.Process(client.pid)
        servers = sum(c.memory_info().rss for c in worker.children())
        torch = any("libtorch" in m.path for m in worker.memory_maps())
        row = {"load": label, "pair": pair, "engine": ev["engine"], "seconds": round(seconds, 1),
               "worker_mb": round(worker.memory_info().rss / 2**20), "server_mb": round(servers / 2**20),
               "pytorch_loaded": torch}
        print(json.dumps(row), flush=True)
        return row
    finally:
        client.shutdown(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", choices=("chat", "demo"), default="chat")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        os.environ["DFLASH_DESKTOP_HOME"] = home
        rows = [load_once("first load: compares the engines", args.pair),
                load_once("second start: the remembered engine", args.pair)]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
