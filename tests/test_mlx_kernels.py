"""The Gated DeltaNet replay (engine/backends/mlx/kernels.py): the pure-MLX reference equals mlx-lm's own
delta rule, this machine (no Metal) runs that reference, and on Apple hardware the Metal kernel equals
it. The Metal tests are skipped wherever Metal is missing: they never ran in this project's Linux CI,
only a macOS job would run them (docs/ENGINES.md)."""
import pytest

mx = pytest.importorskip("mlx.core", reason="the mlx engine needs mlx (pip install 'dflash-desktop[mlx]')")

from engine.backends.mlx import kernels  # noqa: E402

NEEDS_METAL = pytest.mark.skipif(not mx.metal.is_available(),
                                 reason="needs Apple's GPU (Metal); runs on a macOS CI job, never on Linux")


def inputs(t: int, hk: int = 2, hv: int = 4, dk: int = 32, dv: int = 16, dtype=mx.float32, seed: int = 0):
    """Random delta-rule inputs shaped as Qwen3.5's (normalised keys, decays in (0, 1), betas in (0, 1))."""
    mx.random.seed(seed)
    k = mx.random.normal((1, t, hk, dk))
    k = (k / mx.linalg.norm(k, axis=-1, keepdims=True)).astype(dtype)
    v = mx.random.normal((1, t, hv, dv)).astype(dtype)
    g = mx.random.uniform(0.5, 1.0, (1, t, hv))
    beta = mx.random.uniform(0.0, 1.0, (1, t, hv))
    state = mx.random.normal((1, hv, dv, dk)) * 0.1
    return k, v, g, beta, state


@pytest.mark.parametrize("t", [1, 3, 16])
def test_reference_replay_is_mlx_lms_delta_rule(t):
    from mlx_lm.models.gated_delta import gated_delta_ops
    k, v, g, beta, state = inputs(t)
    with mx.stream(mx.cpu):
        _, expected = gated_delta_ops(mx.zeros_like(k), k, v, g, beta, state)
        got = kernels.replay_reference(k, v, g, beta, state)
    assert mx.allclose(got, expected, rtol=1e-5, atol=1e-6).item()


def test_this_machine_replays_with_the_reference(monkeypatch):
    """Asked for the kernel on a CPU device (or without Metal), replay() runs the reference."""
    monkeypatch.setenv(kernels.ENV, "1")
    k, v, g, beta, state = inputs(5)
    assert kernels.metal_fits(k, v, state) is mx.metal.is_available()
    with mx.stream(mx.cpu):
        got = kernels.replay(k, v, g, beta, state, mx.cpu)
        assert mx.array_equal(got, kernels.replay_reference(k, v, g, beta, state)).item()


def test_the_kernel_is_off_unless_asked_for(monkeypatch):
    monkeypatch.delenv(kernels.ENV, raising=False)
    calls = []
    monkeypatch.setattr(kernels, "replay_metal", lambda *a: calls.append(a))
    k, v, g, beta, state = inputs(2)
    kernels.replay(k, v, g, beta, state, mx.gpu if mx.metal.is_available() else mx.cpu)
    assert not calls


@NEEDS_METAL
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("t, hk, hv, dk, dv", [(1, 2, 4, 32, 16), (7, 16, 32, 128, 128), (16, 2, 4, 64, 12)])
def test_metal_kernel_equals_the_reference(dtype, t, hk, hv, dk, dv):
    k, v, g, beta, state = inputs(t, hk, hv, dk, dv, dtype)
    with mx.stream(mx.gpu):
        got = kernels.replay_metal(k, v, g, beta, state)
        expected = kernels.replay_reference(k, v, g, beta, state)
    assert mx.allclose(got, expected, rtol=1e-4, atol=1e-5).item()


@NEEDS_METAL
def test_a_hybrid_pair_on_the_gpu_with_the_kernel_stays_lossless(monkeypatch):
    from engine.backends.mlx.engine import MlxPair
    from engine.backends.mlx.target import MlxTarget
    from tests.tiny_mlx import random_drafter, random_model, target_config
    from engine.limits import GenerationSettings
    from engine.loop import Generation
    from tests.oracle import OraclePair
    monkeypatch.setenv(kernels.ENV, "1")
    config = target_config("qwen3_5", hidden=128, heads=4, kv_heads=2)   # DeltaNet key heads of 32: the kernel fits
    with mx.stream(mx.gpu):
        target = MlxTarget(random_model(config, seed=3), config, mx.gpu)
        pair = MlxPair(target, random_drafter(target, seed=4, block_size=8), None, family="qwen3_5")
    prompt = list(range(3, 43))
    ref = Generation(pair, prompt, GenerationSettings(max_new_tokens=40), baseline=True).run().tokens
    run = Generation(OraclePair(pair, ref, wrong_every=3), prompt,
                     GenerationSettings(max_new_tokens=40, block_size=8, plain_fallback=False)).run()
    assert run.tokens == ref and 0 < run.stats.acceptance_rate < 1
