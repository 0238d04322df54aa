"""Triton kernels for the CUDA path (cuda.py), each with the plain-torch function the engine itself runs
as its reference:

- verification on the device: compare the drafts with the target's choices, count the accepted prefix
  and pick the target's own token, greedy (`verify_greedy`, reference `sampling.prefix_outcome`) or by
  the residual rule (`verify_sampled`, reference `verify_sampled_reference`, built from sampling.py's
  `leading_accepts` and `residual`), writing [n, token] to a 2-element device tensor, so one small
  read crosses to the host per step;
- attention over a cache (`cached_attention`, reference `draft_runner.block_attention` with
  `draft_runner.block_mask`), for the drafter and the dense target: queries from the last positions,
  keys and values from a preallocated cache, causal or not (the drafter's block sees itself whole),
  grouped-query heads, sliding windows; a long cache is split across programs and the shares combined.
  The visible length is read from a device tensor, so a captured CUDA graph replays it at any length.

Imported only on CUDA and by the tests (`TRITON_INTERPRET=1` runs the kernels on a CPU, in float32).
The sampled kernel draws its token by inverse CDF from a given uniform; sampling.py draws with
torch.multinomial. Both are exact draws from the same residual, but not the same random stream.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sampling import leading_accepts, residual


# ---- verification --------------------------------------------------------------------------------

@triton.jit
def _verify_greedy(drafts_ptr, choices_ptr, out_ptr, k, BLOCK_K: tl.constexpr):
    i = tl.arange(0, BLOCK_K)
    live = i < k
    d = tl.load(drafts_ptr + i, mask=live, other=0)
    c = tl.load(choices_ptr + i, mask=live, other=0)
    n = tl.min(tl.where(live & (d != c), i, k), axis=0)
    tl.store(out_ptr, n.to(tl.int64))
    tl.store(out_ptr + 1, tl.load(choices_ptr + n).to(tl.int64))


def verify_greedy(drafts: torch.Tensor, choices: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """drafts [k], the target's choices [k+1] (argmax, or its own samples for the `match` rule).
    Returns out: int64 [2] = [accepted drafts n, choices[n]]."""
    out = torch.empty(2, dtype=torch.long, device=choices.device) if out is None else out
    k = drafts.shape[0]
    _verify_greedy[(1,)](drafts, choices, out, k, BLOCK_K=triton.next_power_of_2(max(k, 1)))
    return out


@triton.jit
def _verify_sampled(p_ptr, q_ptr, drafts_ptr, u_ptr, u2_ptr, out_ptr, k, V,
                    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    i = tl.arange(0, BLOCK_K)
    live = i < k
    d = tl.load(drafts_ptr + i, mask=live, other=0)
    p_d = tl.load(p_ptr + i * V + d, mask=live, other=0.0)
    q_d = tl.load(q_ptr + i * V + d, mask=live, other=1.0)
    u = tl.load(u_ptr + i, mask=live, other=0.0)
    n = tl.min(tl.where(live & (u >= p_d / q_d), i, k), axis=0)   # the first rejected draft, else k
    has_q = n < k                                                 # all accepted: the bonus row is p[k]
    q_len = tl.where(has_q, V, 0)                                 # q's row n, where there is one
    # pass 1: the residual's mass, and p's (used when p == q up to rounding)
    rest_sum = tl.zeros((), dtype=tl.float32)
    p_sum = tl.zeros((), dtype=tl.float32)
    for s in range(0, V, BLOCK_V):
        j = s + tl.arange(0, BLOCK_V)
        m = j < V
        p = tl.load(p_ptr + n * V + j, mask=m, other=0.0)
        q = tl.load(q_ptr + n * V + j, mask=j < q_len, other=0.0)
        rest_sum += tl.sum(tl.maximum(p - q, 0.0), axis=0)
        p_sum += tl.sum(p, axis=0)
    use_q = has_q & (rest_sum > 0)
    q_len = tl.where(use_q, V, 0)
    total = tl.where(use_q, rest_sum, p_sum)
    target = tl.load(u2_ptr) * total
    # pass 2: the first token whose running mass exceeds u2 * total (else the last one with mass)
    running = tl.zeros((), dtype=tl.float32)
    first = tl.full((), V, dtype=tl.int32)
    last = tl.full((), -1, dtype=tl.int32)
    for s in range(0, V, BLOCK_V):
        j = s + tl.arange(0, BLOCK_V)
        m = j < V
        p = tl.load(p_ptr + n * V + j, mask=m, other=0.0)
        q = tl.load(q_ptr + n * V + j, mask=j < q_len, other=0.0)
        w = tl.maximum(p - q, 0.0)
        c = running + tl.cumsum(w, axis=0)
        first = tl.minimum(first, tl.min(tl.where(m & (w > 0) & (c > target), j, V), axis=0))
        last = tl.maximum(last, tl.max(tl.where(m & (w > 0), j, -1), axis=0))
        running += tl.sum(w, axis=0)
    token = tl.where(first < V, first, last)
    tl.store(out_ptr, n.to(tl.int64))
    tl.store(out_ptr + 1, token.to(tl.int64))


def verify_sampled(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, u: torch.Tensor, u2: torch.Tensor,
                   out: torch.Tensor | None = None, block_v: int = 1024) -> torch.Tensor:
    """Exact speculative sampling on the device. p [k+1, V] the target's distributions (float32), q [k, V]
    the drafts' proposal distributions (dense), drafts [k], u [k] and u2 [1] uniforms in [0, 1).
    Returns out: int64 [2] = [accepted drafts n, the target's own token]."""
    out = torch.empty(2, dtype=torch.long, device=p.device) if out is None else out
    k, vocab = drafts.shape[0], p.shape[-1]
    q = q if k else p[:0]
    _verify_sampled[(1,)](p.contiguous(), q.contiguous(), drafts, u, u2, out, k, vocab,
                          BLOCK_K=triton.next_power_of_2(max(k, 1)), BLOCK_V=block_v)
    return out


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token a uniform u picks from probs (normalised or not) by inverse CDF; only tokens with mass."""
    mass = torch.cumsum(probs, 0)
    hit = (mass > u * mass[-1]) & (probs > 0)
    return torch.where(hit.any(), hit.int().argmax(), (probs > 0).nonzero().max())


def verify_sampled_reference(p, q, drafts, u, u2) -> tuple[int, int]:
    """verify_sampled in plain torch, from the pieces sampling.verify runs (leading_accepts, residual)."""
    k = drafts.shape[0]
    rows = torch.arange(k, device=p.device)
    n = int(leading_accepts(p[rows, drafts] / q[rows, drafts], u)) if k else 0
    row = residual(p[n], q[n]) if n < k else p[n]
    return n, int(inverse_cdf(row, u2[0]))


# ---- attention over a cache ----------------------------------------------------------------------

# A few queries (a decoding step, a verify, a draft block) over a long cache: the cache is split across
# programs, SPLIT_ROWS rows each (more per program past MAX_SPLITS, which bounds the partial results), and
# their shares combined. More queries (a prefill chunk) keep the GPU busy without splitting. A verify holds up to
# 17 queries (a DSpark drafter drafting from its anchor slot: 16 drafts and the last token).
SPLIT_ROWS = 256
MAX_SPLITS = 32
SPLIT_MAX_QUERIES = 32


@triton.jit
def _cached_attention(q_ptr, k_ptr, v_ptr, o_ptr, m_ptr, l_ptr, end_ptr, n, D, group, window, scale,
                      sq_h, sq_m, sk_h, sk_n, sv_h, sv_n, so_h, so_s, so_m, chunk,
                      CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, SPLIT: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.program_id(0)
    split = tl.program_id(2)
    kv = h // group
    end = tl.load(end_ptr).to(tl.int32)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = rows < n
    qpos = end - n + rows                       # the queries are the last n of the `end` visible positions
    dd = tl.arange(0, BLOCK_D)
    dm = dd < D
    q = tl.load(q_ptr + h * sq_h + rows[:, None] * sq_m + dd[None, :], mask=live[:, None] & dm[None, :], other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, end)
    if WINDOWED:                                 # keys further than the window from every query are skipped
        lo = tl.maximum(lo, tl.maximum(end - n - window + 1, 0) // BLOCK_N * BLOCK_N)
    for s in range(lo, hi, BLOCK_N):
        cols = s + tl.arange(0, BLOCK_N)
        inside = cols < hi
        kt = tl.load(k_ptr + kv * sk_h + cols[None, :] * sk_n + dd[:, None], mask=inside[None, :] & dm[:, None],
                     other=0.0)
        scores = tl.dot(q, kt) * scale
        visible = inside[None, :] & live[:, None]
        if CAUSAL:
            visible = visible & (cols[None, :] <= qpos[:, None])
        if WINDOWED:
            visible = visible & (qpos[:, None] - cols[None, :] < window) & (cols[None, :] - qpos[:, None] < window)
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        probs = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(probs, axis=1)
        v = tl.load(v_ptr + kv * sv_h + cols[:, None] * sv_n + dd[None, :], mask=inside[:, None] & dm[None, :],
                    other=0.0)
        acc = acc * alpha[:, None] + tl.dot(probs.to(v.dtype), v)
        m_i = m_new
    if SPLIT:                                    # this split's share, unnormalised: _combine_splits adds them
        at = (h * tl.num_programs(2) + split) * n + rows
        tl.store(m_ptr + at, m_i, mask=live)
        tl.store(l_ptr + at, l_i, mask=live)
        tl.store(o_ptr + h * so_h + split * so_s + rows[:, None] * so_m + dd[None, :], acc,
                 mask=live[:, None] & dm[None, :])
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptr + h * so_h + rows[:, None] * so_m + dd[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=live[:, None] & dm[None, :])


@triton.jit
def _combine_splits(part_ptr, m_ptr, l_ptr, o_ptr, n, D, splits, sp_h, sp_s, sp_m, so_h, so_m,
                    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.program_id(0)
    row = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    sm = s < splits
    dd = tl.arange(0, BLOCK_D)
    dm = dd < D
    m = tl.load(m_ptr + (h * splits + s) * n + row, mask=sm, other=float("-inf"))
    l = tl.load(l_ptr + (h * splits + s) * n + row, mask=sm, other=0.0)
    top = tl.max(m, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.where(sm & (m > float("-inf")), tl.exp(m - top), 0.0)
    part = tl.load(part_ptr + h * sp_h + s[:, None] * sp_s + row * sp_m + dd[None, :],
                   mask=sm[:, None] & dm[None, :], other=0.0)
    total = tl.sum(w * l, axis=0)
    out = tl.sum(part * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(o_ptr + h * so_h + row * so_m + dd, out.to(o_ptr.dtype.element_ty), mask=dm)


def cached_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, end: torch.Tensor,
                     window: int | None = None, causal: bool = False, rows: int | None = None,
                     max_splits: int = MAX_SPLITS) -> torch.Tensor:
    """q [heads, n, d] the queries of the last n positions (roped), keys/values [kv_heads, L, d] with every
    position < end (a 1-element device tensor, end <= L) and stale rows after. Returns [heads, n, d]; the
    same numbers as block_attention(q, keys, values, end, block_mask(end, n, window, causal)). rows (a
    bound on end, L when not given) sets how many programs share the keys (SPLIT_ROWS each, at most
    max_splits); those past end return at once, so a captured graph stays right at any end <= rows."""
    heads, n, d = q.shape
    kv_heads, length = keys.shape[0], keys.shape[1]
    span = min(rows or length, length)
    chunk = max(SPLIT_ROWS, triton.cdiv(triton.cdiv(span, max_splits), 32) * 32)
    splits = triton.cdiv(span, chunk) if n <= SPLIT_MAX_QUERIES else 1
    chunk = chunk if splits > 1 else length          # one program reads the whole cache
    out = torch.empty_like(q)
    block_d = max(16, triton.next_power_of_2(d))
    split = splits > 1
    if split:
        part = torch.empty(heads, splits, n, d, dtype=torch.float32, device=q.device)
        m = torch.empty(heads, splits, n, dtype=torch.float32, device=q.device)
        l = torch.empty_like(m)
        target, strides = part, (part.stride(0), part.stride(1), part.stride(2))
    else:
        m = l = out
        target, strides = out, (out.stride(0), 0, out.stride(1))
    grid = (heads, triton.cdiv(n, 16), splits)
    _cached_attention[grid](q, keys, values, target, m, l, end, n, d, heads // kv_heads, window or 0, d ** -0.5,
                            q.stride(0), q.stride(1), keys.stride(0), keys.stride(1),
                            values.stride(0), values.stride(1), *strides, chunk,
                            CAUSAL=causal, WINDOWED=window is not None, SPLIT=split,
                            BLOCK_M=16, BLOCK_N=32, BLOCK_D=block_d)
    if split:
        _combine_splits[(heads, n)](part, m, l, out, n, d, splits, *strides, out.stride(0), out.stride(1),
                                    BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d)
    return out
