"""Will this pair fit on this machine? Memory estimates with the numbers behind them.

The estimate adds, for a chosen context length:
  target weights + drafter weights
  + target KV cache      2 * attention_layers * kv_heads * head_dim * kv_bytes * tokens
  + drafter KV cache     2 * drafter_layers * drafter_kv_heads * drafter_head_dim * kv_bytes * tokens
  + captured features    captured_layers * hidden * kv_bytes * tokens   (the drafter's context)
  + recurrent state      hybrid targets only; twice with DFlash (a snapshot to roll back)
  + attention scores     score_rows * attention_heads * 4 * tokens (llama.cpp on a CPU, without flash attention)
  + runtime margin       1 GiB + 5% of the weights (CUDA/Metal context, activations, allocator slack)
and compares it with the device budget (free VRAM, ~70% of Apple unified memory, or available RAM).
Every term is returned so the UI can show the breakdown, not just a verdict.

On a CPU, plain decoding reads every weight once per token, so its speed is about the measured memory
streaming rate divided by the weight bytes an active token touches; the estimate says so when that is slow.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from engine.backends import DEVICE_LABELS, ENGINES, METHODS
from engine.limits import DEFAULT_CONTEXT

from .catalog import Catalog, Pair
from .hardware import HardwareReport, gib, video_memory_source
from .run_plan import RunPlan, plans_here

DEFAULT_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "q8_0": 1.0625, "q4": 0.5625, "q4_k_m": 0.6,
                       "mxfp4": 0.53125, "mxfp4_moe": 0.53125, "nf4": 0.5625}
MARGIN_FIXED = 2**30
MARGIN_FRACTION = 0.05
FITS_FRACTION = 0.85  # above this share of the budget we call it "tight"
VERDICTS = ("fits", "tight", "target_only", "wont_fit")
SLOW_TOK_S = 5.0   # below this many plain tokens per second, the picker says the pair runs slowly here


@dataclass(frozen=True)
class Budget:
    """Memory the models may use on one device class."""

    bytes: int
    device: str
    source: str
    bytes_per_s: float | None = None   # measured memory streaming rate (CPU only)

    @classmethod
    def from_report(cls, report: HardwareReport, device: str | None = None) -> "Budget":
        """The budget of this computer's chosen device, or of its CPU."""
        if device in (None, report.device):
            rate = report.memory_bytes_per_s if report.device == "cpu" else None
            return cls(report.budget_bytes, report.device, report.budget_source, rate)
        if device == "vulkan" and report.vulkan_gpus:     # the card CUDA drives, as llama.cpp's Vulkan sees it
            g = report.vulkan_gpus[0]
            return cls(g.memory_free, "vulkan", video_memory_source(g))
        return cls(report.ram_available, "cpu", "available RAM", report.memory_bytes_per_s)


@dataclass
class FitEstimate:
    pair_id: str
    device: str
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
    read_per_token_bytes: int  # weights plain decoding reads per token (the active ones of an MoE)
    bytes_per_s: float | None  # measured memory streaming rate of the device (CPU only)
    sentence: str
    plan: RunPlan | None = None
    gpu_layers: int | None = None   # llama.cpp on a GPU: the target's layers its memory holds (the rest: the CPU)
    target_layers: int | None = None

    @property
    def partial(self) -> bool:
        """Only part of the target's layers on the GPU (llama.cpp runs the rest on the CPU)."""
        return self.gpu_layers is not None and self.gpu_layers < (self.target_layers or 0)

    @property
    def plain_tok_s(self) -> float | None:
        """Estimated plain decoding speed on a CPU (None where no memory rate was measured)."""
        return self.bytes_per_s / self.read_per_token_bytes if self.bytes_per_s and self.read_per_token_bytes else None

    def to_dict(self) -> dict:
        return asdict(self)


def _terms(pair: Pair, ctx: int, wbytes: float, kvb: float, dtype_bytes: dict, weight_dtype: str,
           target_bytes: int | None = None, score_rows: int = 0) -> dict:
    t, d = pair.target, pair.drafter
    if target_bytes:                       # an engine's own files (a GGUF variant): their real size
        target_w = int(target_bytes)
    elif weight_dtype == t["native_dtype"] and t.get("native_bytes"):
        target_w = int(t["native_bytes"])
    else:
        target_w = int(t.params * wbytes)
    # the drafter loads in the target's float dtype (float32 on a CPU), never below its own, and only what an
    # engine keeps of it (loaded_params: a speculators drafter's copies of the target's embedding and head are
    # downloaded, never loaded); a method without one (MTP heads inside the target, n-gram lookup) adds nothing
    # the target's own terms do not count
    drafter_w = int(d.get("loaded_params", d.params) * max(wbytes, dtype_bytes[d["dtype"]])) if d else 0
    per_tok_kv = 2 * t["attention_layers"] * t["num_kv_heads"] * t["head_dim"] * kvb
    per_tok_dkv = 2 * d["layers"] * d["num_kv_heads"] * d["head_dim"] * kvb if d else 0
    per_tok_feat = d["captured_layers"] * t["hidden_size"] * kvb if d else 0
    per_tok_scores = score_rows * t["num_attention_heads"] * 4
    rec = int(t.get("recurrent_state_bytes", 0))
    active = t.get("active_params") or t.params   # a mixture of experts reads only its active experts
    return {
        "target_weights": target_w,
        "drafter_weights": drafter_w,
        "kv_cache": int(per_tok_kv * ctx),
        "drafter_kv_cache": int(per_tok_dkv * ctx),
        "captured_features": int(per_tok_feat * ctx),
        "recurrent_state": 2 * rec,
        "attention_scores": int(per_tok_scores * ctx),
        "runtime_margin": int(MARGIN_FIXED + MARGIN_FRACTION * (target_w + drafter_w)),
        # helpers, removed before returning
        "_per_token": per_tok_kv + per_tok_dkv + per_tok_feat + per_tok_scores,
        "_target_only": int(target_w + (per_tok_kv + per_tok_scores) * ctx + rec + MARGIN_FIXED
                            + MARGIN_FRACTION * target_w),
        "_read_per_token": int(target_w * active / t.params),
    }


def estimate_fit(pair: Pair, budget: Budget, context_tokens: int = DEFAULT_CONTEXT,
                 weight_dtype: str | None = None, kv_dtype: str = "bf16",
                 dtype_bytes: dict | None = None, target_bytes: int | None = None,
                 score_rows: int = 0) -> FitEstimate:
    """Estimate memory for ``pair`` at ``context_tokens`` and judge it against ``budget``; score_rows: the
    engine's (EngineInfo.score_rows)."""
    dtype_bytes = {**DEFAULT_DTYPE_BYTES, **(dtype_bytes or {})}
    weight_dtype = weight_dtype or pair.target["native_dtype"]
    if weight_dtype not in dtype_bytes or kv_dtype not in dtype_bytes:
        raise ValueError(f"Unknown dtype: choose from {', '.join(dtype_bytes)}")
    ctx = min(int(context_tokens), int(pair.target["max_context"]))  # the model cannot use more
    terms = _terms(pair, ctx, dtype_bytes[weight_dtype], dtype_bytes[kv_dtype], dtype_bytes, weight_dtype,
                   target_bytes, score_rows)
    per_token, target_only = terms.pop("_per_token"), terms.pop("_target_only")
    read_per_token = terms.pop("_read_per_token")
    total = sum(terms.values())
    fixed = (total - terms["kv_cache"] - terms["drafter_kv_cache"] - terms["captured_features"]
             - terms["attention_scores"])
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
    est = FitEstimate(pair_id=pair.id, device=budget.device, context_tokens=ctx, weight_dtype=weight_dtype,
                      kv_dtype=kv_dtype, budget_bytes=int(budget.bytes), budget_source=budget.source,
                      breakdown=terms, total_bytes=int(total), target_only_bytes=int(target_only),
                      verdict=verdict, dflash=verdict in ("fits", "tight"), max_context_tokens=max_ctx,
                      read_per_token_bytes=read_per_token, bytes_per_s=budget.bytes_per_s, sentence="")
    est.sentence = _sentence(pair, est)
    return est


def estimate_here(pair: Pair, report: HardwareReport, context_tokens: int = DEFAULT_CONTEXT,
                  dtype_bytes: dict | None = None) -> FitEstimate | None:
    """The fit of a pair with the engine, device and dtype it would load with here; None when no engine of this
    app runs it on this computer. Every engine and GPU that could run it (run_plan.plans_here) is estimated,
    and the first of those that holds it best is planned (_rank); the sentence says why when that is not the
    first choice."""
    estimates = [_estimate_one(pair, plan, report, context_tokens, dtype_bytes)
                 for plan in plans_here(pair, report)]
    if not estimates:
        return None
    chosen = max(estimates, key=_rank)         # the first of the best: the device's and catalog's order
    if chosen is not estimates[0]:
        first = estimates[0]
        chosen.sentence += (f" {ENGINES[chosen.plan.engine].label} runs it rather than "
                            f"{ENGINES[first.plan.engine].label} on the {DEVICE_LABELS[first.plan.device_class]}, "
                            f"which {_shortfall(pair, first)}.")
    return chosen


def _estimate_one(pair: Pair, plan: RunPlan, report: HardwareReport, context_tokens: int,
                  dtype_bytes: dict | None) -> FitEstimate:
    """One plan's fit. Where the full-precision weights leave no room for DFlash, the first of the engine's
    quantizing variants (catalog.py) that does is planned."""
    budget = Budget.from_report(report, plan.device_class)
    est = _estimate_plan(pair, plan, budget, context_tokens, dtype_bytes)
    if plan.engine == "llamacpp" and plan.device_class != "cpu":
        return _offload(pair, est, report)
    if not est.dflash:
        for variant in pair.quantizing(plan.engine, plan.device_class):
            smaller = _estimate_plan(pair, replace(plan, dtype=variant.dtype, variant=variant), budget,
                                     context_tokens, dtype_bytes)
            if smaller.dflash:
                smaller.sentence += (f" Its weights are quantized to {variant.label} while loading: in full "
                                     f"precision the pair needs about {gib(est.total_bytes)}.")
                return smaller
    return est


def _rank(e: FitEstimate) -> int:
    """How well a plan holds the pair: 3 whole on a GPU from the engine's own files, 2 whole on a GPU but
    quantized while loading (bitsandbytes' kernels are slow), 1 partly on the GPU or on the CPU, 0 without
    room for speculation."""
    if not e.dflash:
        return 0
    if e.plan.device_class == "cpu" or e.partial:
        return 1
    return 2 if e.plan.variant is not None and e.plan.variant.quantizes else 3


def _shortfall(pair: Pair, e: FitEstimate) -> str:
    """Why a plan lost to another (_rank), in words that follow "which"."""
    rank = _rank(e)
    if rank == 0:
        return (f"cannot hold it with its drafter in {gib(e.budget_bytes)}"
                + (" even quantized while loading" if pair.quantizing(e.plan.engine, e.plan.device_class) else "")
                + f" (about {gib(e.total_bytes)} in {e.weight_dtype})")
    if rank == 1:
        return ("would run it on the CPU" if e.plan.device_class == "cpu" else
                f"would keep only {e.gpu_layers} of its {e.target_layers} layers on the GPU")
    return f"would have to quantize it to {e.plan.variant.label} while loading, where its kernels are slow"


def _offload(pair: Pair, est: FitEstimate, report: HardwareReport) -> FitEstimate:
    """llama.cpp on a GPU holds what fits there and leaves the other layers on the CPU (the engine's own rule,
    engine/backends/llamacpp/gpu.py): a pair too big for the GPU alone still loads when the rest fits in RAM."""
    from engine.backends.llamacpp.gpu import layers_on_gpu
    b, layers = est.breakdown, int(pair.target["layers"])
    est.target_layers = layers
    est.gpu_layers = layers_on_gpu(est.budget_bytes, b["target_weights"], layers,
                                   (b["kv_cache"] + b["recurrent_state"]) // max(layers, 1),
                                   b["drafter_weights"] + b["drafter_kv_cache"] + b["captured_features"])
    if est.gpu_layers in (0, layers):
        return est
    on_cpu = (est.total_bytes - est.budget_bytes) if est.total_bytes > est.budget_bytes else 0
    if on_cpu > report.ram_available:
        return est
    est.verdict, est.dflash = "tight", True
    est.sentence = (f"{pair.name} is larger than the GPU's memory ({gib(est.budget_bytes)} free): llama.cpp keeps "
                    f"{est.gpu_layers} of its {layers} layers there and runs the other {layers - est.gpu_layers} on "
                    f"the CPU, which is slower (about {gib(est.total_bytes)} in all at {est.context_tokens:,} tokens "
                    "of context). A shorter context or a smaller model would fit whole.")
    return est


def quantized_target_bytes(pair: Pair, bytes_per_weight: float) -> int:
    """A target quantized while loading: its decoder's matrices at bytes_per_weight, the embeddings and the
    LM head (counted as two, untied) in bfloat16 as the quantizer leaves them."""
    t = pair.target
    kept = 2 * int(t["vocab_size"]) * int(t["hidden_size"])
    return int(max(t.params - kept, 0) * bytes_per_weight + kept * 2)


def _estimate_plan(pair: Pair, plan: RunPlan, budget: Budget, context_tokens: int,
                   dtype_bytes: dict | None) -> FitEstimate:
    variant = plan.variant
    if variant is None:
        target_bytes = None
    elif variant.quantizes:
        target_bytes = quantized_target_bytes(pair, ENGINES[plan.engine].quantized[variant.dtype])
    else:
        target_bytes = variant.bytes
    est = estimate_fit(pair, budget, context_tokens, weight_dtype=plan.catalog_dtype, kv_dtype=plan.kv_dtype,
                       dtype_bytes=dtype_bytes, target_bytes=target_bytes,
                       score_rows=ENGINES[plan.engine].score_rows if plan.device_class == "cpu" else 0)
    est.plan = plan
    return est


def _sentence(pair: Pair, e: FitEstimate) -> str:
    need, have = gib(e.total_bytes), f"{gib(e.budget_bytes)} ({e.budget_source})"
    ctx = f"{e.context_tokens:,} tokens of context"
    method = METHODS[pair.method]
    if e.verdict == "fits" and e.plain_tok_s is not None and e.plain_tok_s < SLOW_TOK_S:
        return (f"{pair.name} fits ({need} of {have} at {ctx}) but runs slowly here: plain decoding would "
                f"make about {e.plain_tok_s:.1f} tokens per second, because each token reads "
                f"{gib(e.read_per_token_bytes)} of weights and this computer streams memory at a measured "
                f"{gib(e.bytes_per_s)}/s. {method} multiplies that only as far as its drafts are accepted.")
    with_it = ("with its MTP assistant" if pair.drafter and pair.method == "mtp" else
               f"with its {method} drafter" if pair.drafter else
               "with its MTP heads" if pair.method == "mtp" else f"with {method}")
    if e.verdict == "fits":
        return f"{pair.name} {with_it} fits: about {need} of {have} at {ctx}."
    if e.verdict == "tight":
        return (f"{pair.name} {with_it} should fit, but tightly: about {need} of {have} at {ctx}. "
                "Close other GPU-heavy apps or choose a shorter context.")
    extra = e.total_bytes - e.target_only_bytes
    if e.verdict == "target_only":
        return (f"Only the target model fits ({gib(e.target_only_bytes)} of {have} at {ctx}); {method} will be "
                f"off because the drafter, its KV cache and the captured features need another {gib(extra)}. "
                "Generation runs at normal (non-speculative) speed"
                + (", or choose n-gram lookup, which needs no drafter." if any(
                    o.method == "ngram" for o in pair.speculations) else "."))
    hint = (f" With DFlash it would fit up to {e.max_context_tokens:,} tokens of context."
            if e.max_context_tokens >= 1024 else
            " Try a smaller pair or lower-precision weights (8-bit or 4-bit).")
    return (f"{pair.name} won't fit: it needs about {need} ({gib(e.target_only_bytes)} even without the "
            f"drafter) but only {have} is available at {ctx}.{hint}")


def choose_default_pair(catalog: Catalog, budget: Budget, context_tokens: int = DEFAULT_CONTEXT) -> Pair:
    """The largest downloadable pair that fits (prefer comfortable over tight, ungated over gated).

    Never returns a pair that won't fit or would run without DFlash; falls back to the built-in pair a
    first start opens (the chat pair where its model is installed, else the code pair).
    """
    rank = {"fits": 2, "tight": 1}
    best, best_key = None, None
    for pair in catalog.for_device(budget.device):
        if not pair.needs_download:
            continue
        est = estimate_fit(pair, budget, context_tokens, dtype_bytes=catalog.dtype_bytes)
        if est.verdict not in rank:
            continue
        key = (rank[est.verdict], not pair.target.gated, pair.target.params)
        if best_key is None or key > best_key:
            best, best_key = pair, key
    return best or catalog.starter()
