"""Replaying the gated delta rule over the accepted tokens of a verify: the recurrent state of a Gated
DeltaNet layer after those tokens, from the state before the verify. Only the state is wanted, so
neither the queries nor the outputs are computed.

Two implementations: `replay_reference`, plain MLX operations one token at a time (the reference, and
what runs on a CPU and by default), and `replay_metal`, one Metal kernel that keeps each state row in
registers across all the tokens. The kernel is used only where DFLASH_MLX_METAL_REPLAY=1 asks for it
and Metal is there: no benchmark on a Mac has shown it faster yet (docs/BENCHMARKS.md), and
tests/test_mlx_kernels.py holds it to the reference on Apple hardware (skipped elsewhere).

Per token t and value head h (state S is Dv x Dk, k normalised, g the decay, beta the write strength):
    S = g * S;  delta = (v - S k) * beta;  S = S + delta k^T
"""
from __future__ import annotations

import os
from functools import lru_cache

import mlx.core as mx

ENV = "DFLASH_MLX_METAL_REPLAY"


@mx.compile
def _step(k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array) -> mx.array:
    """One token: k [B, H, Dk], v [B, H, Dv], g and beta [B, H], state [B, H, Dv, Dk]."""
    state = state * g[..., None, None]
    delta = (v - (state * k[..., None, :]).sum(axis=-1)) * beta[..., None]
    return state + k[..., None, :] * delta[..., None]


def replay_reference(k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array) -> mx.array:
    """k [B, T, Hk, Dk], v [B, T, Hv, Dv], g and beta [B, T, Hv], state [B, Hv, Dv, Dk] (float32).
    Returns the state after the T tokens."""
    if (repeat := v.shape[2] // k.shape[2]) > 1:
        k = mx.repeat(k, repeat, axis=2)
    for t in range(k.shape[1]):
        state = _step(k[:, t], v[:, t], g[:, t], beta[:, t], state)
    return state


# One SIMD group of 32 threads per state row (value head h, row dv); each thread holds Dk/32 of the row's
# elements in registers for all T tokens, and the row's dot product with k is a simd_sum.
_SOURCE = """
    uint head = thread_position_in_grid.z;          // batch * Hv + value head
    uint b = head / Hv;
    uint hv = head % Hv;
    uint hk = hv / (Hv / Hk);
    uint row = thread_position_in_grid.y;           // dv
    uint lane = thread_position_in_threadgroup.x;   // 0..31
    constexpr int per_lane = Dk / 32;
    int steps = T;

    float s[per_lane];
    const device float* in_row = state_in + (head * Dv + row) * Dk + lane * per_lane;
    for (int i = 0; i < per_lane; ++i) {
        s[i] = in_row[i];
    }
    for (int t = 0; t < steps; ++t) {
        const device InT* kt = k + ((b * steps + t) * Hk + hk) * Dk + lane * per_lane;
        float decay = static_cast<float>(g[(b * steps + t) * Hv + hv]);
        float dot = 0.0f;
        for (int i = 0; i < per_lane; ++i) {
            s[i] *= decay;
            dot += s[i] * static_cast<float>(kt[i]);
        }
        dot = simd_sum(dot);
        float vt = static_cast<float>(v[((b * steps + t) * Hv + hv) * Dv + row]);
        float delta = (vt - dot) * static_cast<float>(beta[(b * steps + t) * Hv + hv]);
        for (int i = 0; i < per_lane; ++i) {
            s[i] += static_cast<float>(kt[i]) * delta;
        }
    }
    device float* out_row = state_out + (head * Dv + row) * Dk + lane * per_lane;
    for (int i = 0; i < per_lane; ++i) {
        out_row[i] = s[i];
    }
"""


@lru_cache(maxsize=1)
def _kernel():
    return mx.fast.metal_kernel(name="dflash_gated_delta_replay", input_names=["k", "v", "g", "beta", "state_in", "T"],
                                output_names=["state_out"], source=_SOURCE)


def replay_metal(k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array) -> mx.array:
    """As replay_reference, in one Metal kernel (Dk a multiple of 32, Dv of 4, float32 state)."""
    b, t, hk, dk = k.shape
    hv, dv = v.shape[2:]
    return _kernel()(inputs=[k, v, g.astype(mx.float32), beta.astype(mx.float32), state, t],
                     template=[("InT", k.dtype), ("Dk", dk), ("Dv", dv), ("Hk", hk), ("Hv", hv)],
                     grid=(32, dv, b * hv), threadgroup=(32, 4, 1),
                     output_shapes=[state.shape], output_dtypes=[mx.float32])[0]


def metal_fits(k: mx.array, v: mx.array, state: mx.array) -> bool:
    return (mx.metal.is_available() and k.shape[-1] % 32 == 0 and v.shape[-1] % 4 == 0
            and state.dtype == mx.float32 and k.dtype == v.dtype)


def replay(k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array, device: mx.Device) -> mx.array:
    """The state after the tokens, by the Metal kernel where it was asked for and can run, else the reference."""
    if device == mx.gpu and os.environ.get(ENV) == "1" and metal_fits(k, v, state):
        return replay_metal(k, v, g, beta, state)
    return replay_reference(k, v, g, beta, state)
