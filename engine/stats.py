"""Generation statistics, with one definition for DFlash and for the plain baseline (block size 1)."""
from __future__ import annotations

from dataclasses import dataclass, field


def cuda_memory(memory: dict) -> dict:
    """The CUDA figures of an engine's memory() (it adds reserved_bytes on CUDA only), as the worker's
    `loaded` event and the stats carry them: None where the pair is not on CUDA."""
    on_cuda = "reserved_bytes" in memory
    return {"cuda_peak_bytes": int(memory["peak_bytes"]) if on_cuda else None,
            "cuda_reserved_bytes": int(memory["reserved_bytes"]) if on_cuda else None}


def process_peak_bytes() -> int:
    """This process's peak resident memory. `resource` is POSIX-only (the import is guarded so the engines
    import on Windows, where psutil reads the peak working set instead)."""
    import sys
    try:
        import resource
    except ImportError:
        import psutil
        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", 0) or info.rss)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)   # Linux reports KiB, macOS bytes


@dataclass
class Stats:
    block_size: int = 1
    prompt_tokens: int = 0
    generated_tokens: int = 0
    drafted: int = 0                 # draft tokens proposed to the target
    accepted: int = 0                # draft tokens the target kept
    steps: int = 0                   # verify passes after prefill
    acceptance_lengths: list[int] = field(default_factory=list)  # tokens committed per verify pass
    position_accepts: list[int] = field(default_factory=list)    # per draft slot k=1..B-1
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    peak_memory_bytes: int = 0
    cuda_peak_bytes: int | None = None      # CUDA only (cuda_memory): the device's allocated peak, and
    cuda_reserved_bytes: int | None = None  # what torch's caching allocator holds; None elsewhere
    fallback: dict | None = None     # set when the loop switched to plain decoding (engine/loop.py)
    unknown: tuple[str, ...] = ()    # counts an engine running its own loop did not report
    speculation: str = "dflash"      # the method that drafts (engine.backends.METHODS key), when `method` is "dflash"
    draft_s: float = 0.0             # a step engine's draft passes, timed on the host
    draft_passes: int = 0
    draft_vocab: int | None = None   # the tokens the drafter proposed from, where fewer than all (draft_vocab.py)

    def record_totals(self, drafted: int | None = None, accepted: int | None = None,
                      steps: int | None = None) -> None:
        """The counts an engine that runs its own loop reports at the end; None means not reported."""
        self.drafted, self.accepted, self.steps = drafted or 0, accepted or 0, steps or 0
        self.unknown = tuple(name for name, value in (("drafted", drafted), ("accepted", accepted),
                                                      ("steps", steps)) if value is None)

    def record_step(self, drafted: int, accepted: int, draft_s: float | None = None) -> None:
        self.steps += 1
        if draft_s is not None:
            self.draft_s += draft_s
            self.draft_passes += 1
        self.drafted += drafted
        self.accepted += accepted
        self.acceptance_lengths.append(accepted + 1)
        if len(self.position_accepts) < self.block_size - 1:
            self.position_accepts.extend([0] * (self.block_size - 1 - len(self.position_accepts)))
        for k in range(accepted):
            self.position_accepts[k] += 1

    @property
    def method(self) -> str:
        """How the answer was decoded, for every figure shown beside it: "dflash" (drafts were verified; `fallback`
        says when it switched to plain decoding), "plain" (nothing drafted: no drafter, a baseline, or the
        engine's own measured choice from the first token) or "server" (a remote server's own speculation)."""
        if self.block_size == 0:
            return "server"
        if self.block_size == 1 or (self.drafted == 0 and "drafted" not in self.unknown):
            return "plain"
        return "dflash"

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tau(self) -> float:
        """Mean tokens committed per target verify pass (1.0 for plain decoding)."""
        if self.acceptance_lengths:
            return sum(self.acceptance_lengths) / len(self.acceptance_lengths)
        return (self.accepted + self.steps) / self.steps if self.steps and "accepted" not in self.unknown else 0.0

    @property
    def position_rates(self) -> list[float]:
        """Share of steps in which the draft at slot k (1-based) was accepted."""
        return [a / self.steps if self.steps else 0.0 for a in self.position_accepts]

    @property
    def histogram(self) -> list[int]:
        """histogram[n-1] = verify passes that committed n tokens, n = 1..B."""
        counts = [0] * max(self.block_size, 1)
        for n in self.acceptance_lengths:
            counts[min(n, len(counts)) - 1] += 1
        return counts

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first one, per second of decoding after the first one."""
        return max(self.generated_tokens - 1, 0) / self.decode_s if self.decode_s else 0.0

    @property
    def total_s(self) -> float:
        return self.ttft_s + self.decode_s

    @property
    def end_to_end_tok_s(self) -> float:
        return self.generated_tokens / self.total_s if self.total_s else 0.0

    def to_dict(self) -> dict:
        return {
            "method": self.method, "block_size": self.block_size, "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens, "drafted": self.drafted,
            "accepted": self.accepted, "steps": self.steps,
            "acceptance_rate": self.acceptance_rate, "tau": self.tau,
            "acceptance_lengths": list(self.acceptance_lengths),
            "position_rates": self.position_rates, "histogram": self.histogram,
            "ttft_s": self.ttft_s, "prefill_s": self.prefill_s, "prefill_tok_s": self.prefill_tok_s,
            "decode_s": self.decode_s, "decode_tok_s": self.decode_tok_s,
            "end_to_end_tok_s": self.end_to_end_tok_s, "peak_memory_bytes": self.peak_memory_bytes,
            "cuda_peak_bytes": self.cuda_peak_bytes, "cuda_reserved_bytes": self.cuda_reserved_bytes,
            "fallback": self.fallback, "unknown": list(self.unknown), "speculation": self.speculation,
            "draft_ms": 1000 * self.draft_s / self.draft_passes if self.draft_passes else None,
            "draft_vocab": self.draft_vocab,
        }
