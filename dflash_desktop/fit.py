"""Will this pair fit on this machine? Memory estimates with the numbers behind them.

The estimate adds, for a chosen context length:
  target weights + drafter weights
  + target KV cache      2 * attention_layers * kv_heads * head_dim * kv_bytes * tokens
  + drafter KV cache     2 * drafter_layers * drafter_kv_heads * drafter_head_dim * kv_bytes * tokens
  + captured features    captured_layers * hidden * kv_bytes * tokens   (the drafter's context)
  + recurrent state      hybrid targets only; twice with DFlash (a snapshot to roll back)
  + runtime margin       1 GiB + 5% of the weights (CUDA/Metal context, activations, allocator slack)
and compares it with the device budget (free VRAM, ~70% of Apple unified memory, or available RAM).
Every term is returned so the UI can show the breakdown, not just a verdict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .catalog import Catalog, Pair
from .hardware import HardwareReport, gib

DEFAULT_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "q8_0": 1.0625, "q4": 0.5625,
                       "mxfp4": 0.53125}
MARGIN_FIXED = 2**30
MARGIN_FRACTION = 0.05
FITS_FRACTION = 0.85  # above this share of the budget we call it "tight"
DEFAULT_CONTEXT = 8192
VERDICTS = ("fits", "tight", "target_only", "wont_fit")


@dataclass(frozen=True)
class Budget:
    """Memory the models may use on the chosen backend."""

    bytes: int
    backend: str
    source: str

    @classmethod
    def from_report(cls, report: HardwareReport) -> "Budget":
        return cls(report.budget_bytes, report.backend, report.budget_source)


@dataclass
class FitEstimate:
    pair_id: str
    backend: str
    context_tokens: int
    weight_dtype: str
    kv_dtype: str
    budget_bytes: int
    budget_source: str
    breakdown: dict[str, int]  # term -> bytes, DFlash on
    total_bytes: int
    target_only_bytes: int  # the same estimate with DFlash off
    verdict: str
    dflash: bool  # whether DFlash can run
    max_context_tokens: int  # longest context that still fits with DFlash on (0: not even the weights)
    sentence: str

    def to_dict(self) -> dict:
        return asdict(self)


def _terms(pair: Pair, ctx: int, wbytes: float, kvb: float, dtype_bytes: dict, weight_dtype: str) -> dict:
    t, d = pair.target, pair.drafter
    if weight_dtype == t["native_dtype"] and t.get("native_bytes"):
        target_w = int(t["native_bytes"])
    else:
        target_w = int(t.params * wbytes)
    drafter_w = int(d.params * dtype_bytes[d["dtype"]])
    per_tok_kv = 2 * t["attention_layers"] * t["num_kv_heads"] * t["head_dim"] * kvb
    per_tok_dkv = 2 * d["layers"] * d["num_kv_heads"] * d["head_dim"] * kvb
    per_tok_feat = d["captured_layers"] * t["hidden_size"] * kvb
    rec = int(t.get("recurrent_state_bytes", 0))
    return {
        "target_weights": target_w,
        "drafter_weights": drafter_w,
        "kv_cache": int(per_tok_kv * ctx),
        "drafter_kv_cache": int(per_tok_dkv * ctx),
        "captured_features": int(per_tok_feat * ctx),
        "recurrent_state": 2 * rec,
        "runtime_margin": int(MARGIN_FIXED + MARGIN_FRACTION * (target_w + drafter_w)),
        # helpers, removed before returning
        "_per_token": per_tok_kv + per_tok_dkv + per_tok_feat,
        "_target_only": int(target_w + per_tok_kv * ctx + rec + MARGIN_FIXED + MARGIN_FRACTION * target_w),
    }


def estimate_fit(pair: Pair, budget: Budget, context_tokens: int = DEFAULT_CONTEXT,
                 weight_dtype: str | None = None, kv_dtype: str = "bf16",
                 dtype_bytes: dict | None = None) -> FitEstimate:
    """Estimate memory for ``pair`` at ``context_tokens`` and judge it against ``budget``."""
    dtype_bytes = {**DEFAULT_DTYPE_BYTES, **(dtype_bytes or {})}
    weight_dtype = weight_dtype or pair.target["native_dtype"]
    if weight_dtype not in dtype_bytes or kv_dtype not in dtype_bytes:
        raise ValueError(f"Unknown dtype: choose from {', '.join(dtype_bytes)}")
    ctx = min(int(context_tokens), int(pair.target["max_context"]))  # the model cannot use more
    terms = _terms(pair, ctx, dtype_bytes[weight_dtype], dtype_bytes[kv_dtype], dtype_bytes, weight_dtype)
    per_token, target_only = terms.pop("_per_token"), terms.pop("_target_only")
    total = sum(terms.values())
    fixed = total - terms["kv_cache"] - terms["drafter_kv_cache"] - terms["captured_features"]
    max_ctx = max(0, int((budget.bytes - fixed) // per_token)) if budget.bytes > fixed else 0
    max_ctx = min(max_ctx, int(pair.target["max_context"]))

    if total <= FITS_FRACTION * budget.bytes:
        verdict = "fits"
    elif total <= budget.bytes:
        verdict = "tight"
    elif target_only <= budget.bytes:
        verdict = "target_only"
    else:
        verdict = "wont_fit"
    est = FitEstimate(pair_id=pair.id, backend=budget.backend, context_tokens=ctx, weight_dtype=weight_dtype,
                      kv_dtype=kv_dtype, budget_bytes=int(budget.bytes), budget_source=budget.source,
                      breakdown=terms, total_bytes=int(total), target_only_bytes=int(target_only),
                      verdict=verdict, dflash=verdict in ("fits", "tight"), max_context_tokens=max_ctx,
                      sentence="")
    est.sentence = _sentence(pair, est)
    return est


def _sentence(pair: Pair, e: FitEstimate) -> str:
    need, have = gib(e.total_bytes), f"{gib(e.budget_bytes)} ({e.budget_source})"
    ctx = f"{e.context_tokens:,} tokens of context"
    if e.verdict == "fits":
        return f"{pair.name} with its DFlash drafter fits: about {need} of {have} at {ctx}."
    if e.verdict == "tight":
        return (f"{pair.name} with its DFlash drafter should fit, but tightly: about {need} of {have} at {ctx}. "
                "Close other GPU-heavy apps or choose a shorter context.")
    extra = e.total_bytes - e.target_only_bytes
    if e.verdict == "target_only":
        return (f"Only the target model fits ({gib(e.target_only_bytes)} of {have} at {ctx}); DFlash will be "
                f"off because the drafter, its KV cache and the captured features need another {gib(extra)}. "
                "Generation runs at normal (non-speculative) speed.")
    hint = (f" With DFlash it would fit up to {e.max_context_tokens:,} tokens of context."
            if e.max_context_tokens >= 1024 else
            " Try a smaller pair or lower-precision weights (8-bit or 4-bit).")
    return (f"{pair.name} won't fit: it needs about {need} ({gib(e.target_only_bytes)} even without the "
            f"drafter) but only {have} is available at {ctx}.{hint}")


def choose_default_pair(catalog: Catalog, budget: Budget, context_tokens: int = DEFAULT_CONTEXT) -> Pair:
    """The largest downloadable pair that fits (prefer comfortable over tight, ungated over gated).

    Never returns a pair that won't fit or would run without DFlash; falls back to the embedded demo.
    """
    rank = {"fits": 2, "tight": 1}
    best, best_key = None, None
    for pair in catalog.for_backend(budget.backend):
        if not pair.needs_download:
            continue
        est = estimate_fit(pair, budget, context_tokens, dtype_bytes=catalog.dtype_bytes)
        if est.verdict not in rank:
            continue
        key = (rank[est.verdict], not pair.target.gated, pair.target.params)
        if best_key is None or key > best_key:
            best, best_key = pair, key
    return best or catalog.demo
