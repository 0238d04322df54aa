"""Matrix products on a CPU with the weight packed once, at load time, into oneDNN's blocked layout.

oneDNN multiplies the 2-16 rows of a DFlash verify pass or draft pass by a weight it laid out for its
own kernels in advance much faster than stock `F.linear` multiplies them by the plain weight: on the
demo pair, a 16-token verify costs about 12% less, a prefill about 10% less, and DFlash decodes about
25% faster (docs/BENCHMARKS.md, "Packed weights"). One-row products (plain decoding) take whichever
path is faster for that weight's shape on this machine (stock for most of the demo target's layers,
packed for its 4096-row LM head), so plain decoding gets the best of both. Same numbers up to float
rounding order, like any change of kernel. Where oneDNN is missing or refuses (other CPUs, GPUs),
everything stays stock.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from functools import lru_cache
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

# The packed copy sits next to the stock weight (one-row steps still use that), so packing doubles the
# linear layers' memory: fine for the small models a CPU runs through torch, not for a large one.
PACK_LIMIT_BYTES = 1 << 30


@lru_cache(maxsize=None)
def can_pack(dtype: torch.dtype) -> bool:
    """Whether this torch build packs and multiplies weights of this dtype on the CPU, correctly."""
    try:
        weight, rows = torch.randn(24, 16).to(dtype), torch.randn(3, 16).to(dtype)
        out = _packed_product(rows, _pack(weight))
        return torch.allclose(out.float(), F.linear(rows, weight).float(), rtol=2e-2, atol=2e-2)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


@lru_cache(maxsize=None)
def one_row_packed_is_faster(shape: tuple[int, int], dtype: torch.dtype) -> bool:
    """Time one-row products of this weight shape both ways, once per process (a few milliseconds)."""
    weight, row = torch.randn(shape).to(dtype), torch.randn(1, shape[1]).to(dtype)
    packed = _pack(weight)

    def best(fn) -> float:
        times = []
        for _ in range(15):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times[3:])
    stock = best(lambda: F.linear(row, weight))
    return best(lambda: _packed_product(row, packed)) * 1.1 < stock


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def _packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def product_by(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x @ weight.T, through a packed copy where that works (the drafter: every call has rows)."""
    if weight.device.type == "cpu" and can_pack(weight.dtype):
        packed = _pack(weight)
        return lambda x: _packed_product(x, packed)
    return lambda x: F.linear(x, weight)


class PackedLinear(nn.Linear):
    """An nn.Linear whose multi-row calls use a packed copy of its weight; one row uses it only where
    that measured faster, and training (which needs gradients) keeps the stock path.
    Same parameters and state-dict keys as the nn.Linear it was; an in-place change of the weight
    (tensor version counter) repacks on the next call."""

    packed: torch.Tensor
    packed_version: int
    packed_one_row: bool   # one-row calls too (where that measured faster)
    stock: bool

    @classmethod
    def adopt(cls, linear: nn.Linear) -> "PackedLinear":
        linear.__class__ = cls
        linear.stock = False
        linear.packed_one_row = one_row_packed_is_faster(tuple(linear.weight.shape), linear.weight.dtype)
        linear.repack()
        return linear

    def repack(self) -> None:
        self.packed, self.packed_version = _pack(self.weight), self.weight._version

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight   # a module attribute lookup; this runs ~40 times per decoding step
        if (self.stock or (not self.packed_one_row and x.numel() == x.shape[-1])
                or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
            return F.linear(x, weight, self.bias)
        if weight._version != self.packed_version:
            self.repack()
        return _packed_product(x, self.packed, self.bias)


def pack_linears(model: nn.Module) -> int:
    """Swap every nn.Linear of a CPU model for a PackedLinear (none past PACK_LIMIT_BYTES, or where
    packing does not work). Returns how many were swapped."""
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    if not linears or any(m.weight.device.type != "cpu" or not can_pack(m.weight.dtype) for m in linears):
        return 0
    if sum(m.weight.nbytes for m in linears) > PACK_LIMIT_BYTES:
        return 0
    for m in linears:
        PackedLinear.adopt(m)
    return len(linears)


@contextmanager
def stock_linears(model: nn.Module) -> Iterator[None]:
    """Run a model on its stock linear layers for a while: the benchmark's transformers peers."""
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    for m in packed:
        m.stock = True
    try:
        yield
    finally:
        for m in packed:
            m.stock = False
