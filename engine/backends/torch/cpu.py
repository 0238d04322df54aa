"""Tuning that pays only on a CPU, applied by the torch engine when a pair loads on one: oneDNN-packed
weights (packed.py), grouped-head attention for multi-token calls, the drafter in bfloat16 where the
CPU multiplies bfloat16 faster, and a confidence cutoff on how many drafts to verify.

On a CPU every verified token costs compute, so verifying drafts the drafter itself doubts rarely pays;
on a GPU a 16-token verify costs about what a 1-token step does, so GPUs verify the whole block.
Measurements: docs/BENCHMARKS.md ("Packed weights", "Step costs", "Draft cutoff").
"""
from __future__ import annotations

import time
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .packed import pack_linears

DRAFT_CUTOFF = 0.05   # measured on the demo pair: docs/BENCHMARKS.md, "Draft cutoff"
GROUPED_SDPA = "grouped_sdpa"  # no "flash" in the name: transformers would take it for a flash kernel


def tune_target(model: nn.Module) -> None:
    """Grouped attention and packed weights for a target that runs on the CPU."""
    use_grouped_sdpa(model)
    pack_linears(model)


def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention copies every key/value head out to the query heads whenever several
    tokens come with a mask, which is every verify of a draft block; torch's CPU kernels take grouped
    heads and a mask together. Single tokens keep transformers' own path, so plain decoding is untouched."""
    if query.shape[2] == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    causal = attention_mask is None and query.shape[2] == key.shape[2]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                         is_causal=causal, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def use_grouped_sdpa(model: nn.Module) -> None:
    """Switch a model on transformers' SDPA attention to grouped_sdpa (other attention kinds keep theirs)."""
    if model.config._attn_implementation != "sdpa":
        return
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    model.set_attn_implementation(GROUPED_SDPA)


def draft_dtype() -> torch.dtype | None:
    """bfloat16 for the drafter where this CPU multiplies bfloat16 faster; else the drafter's own dtype.
    The drafter only proposes, so its precision never changes the output."""
    return torch.bfloat16 if bfloat16_is_faster_here() else None


@lru_cache(maxsize=1)
def bfloat16_is_faster_here() -> bool:
    """Time a drafter-sized product (16 rows) in both dtypes, once per process (~10 ms). CPUs with
    native bfloat16 (AVX512-BF16, AMX, Arm BF16) win clearly; others emulate it and lose."""
    rows, width = torch.randn(16, 512), torch.randn(2048, 512)

    def best(dtype):
        a, w = rows.to(dtype), width.to(dtype)
        times = []
        for _ in range(12):
            start = time.perf_counter()
            F.linear(a, w)
            times.append(time.perf_counter() - start)
        return min(times[2:])
    return best(torch.bfloat16) * 1.3 < best(torch.float32)


def confident_prefix(logits: torch.Tensor | None, q: torch.Tensor | None, cutoff: float) -> int:
    """How many leading drafts to verify: those where the running product of the drafter's top
    probability per slot (a rough chance that all of them are accepted) is >= cutoff. It reads the
    drafter's distributions only, never the tokens drawn from them, so speculative sampling stays exact
    (DFlash2's slot distributions depend on the drafts before the slot, never on the slot's own draft:
    whether a draft is verified is still decided before it is drawn)."""
    probs = torch.softmax(logits.float(), dim=-1) if q is None else getattr(q, "probs", q)   # Candidates: its own
    return int((torch.cumprod(probs.max(-1).values, 0) >= cutoff).sum())
