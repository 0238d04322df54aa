"""Every architecture the MLX engine claims (engine/backends/mlx ARCHITECTURES) decodes losslessly:
greedy DFlash == greedy plain decoding == mlx-lm's own generate, on tiny random stand-ins built with
mlx-lm's own model classes, with prompts longer than the sliding window, every block size, partial
acceptance (an oracle drafter with planted mistakes), EOS and max tokens inside a block, and every
cached array after a rollback against a fresh run on the kept tokens.
Runs on MLX's CPU device (mlx[cpu]); the same code on Apple's GPU never runs in this project's CI."""
import random

import pytest

mx = pytest.importorskip("mlx.core", reason="the mlx engine needs mlx (pip install 'dflash-desktop[mlx]')")

from engine.backends.mlx import ARCHITECTURES  # noqa: E402
from engine.backends.mlx.caches import WindowKVCache, cached_tensors  # noqa: E402
from tests.tiny_mlx import VARIANTS, random_pair  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402
from tests.oracle import OraclePair  # noqa: E402

WINDOW = 16          # the tiny models' sliding window; prompts are longer
PROMPT_LEN = 40


def test_every_claimed_architecture_has_a_stand_in_here():
    assert set(ARCHITECTURES) == set(VARIANTS)


@pytest.fixture(scope="module", params=VARIANTS)
def pair(request):
    return random_pair(request.param, seed=3, vocab=256, hidden=64, layers=6, max_positions=512, window=WINDOW)


def prompt_of(n, seed=0, high=250):
    rng = random.Random(seed)
    return [rng.randrange(1, high) for _ in range(n)]


def settings(**kwargs):
    """Whole blocks verified and no plain fallback, so every run exercises the verify and rollback paths."""
    return GenerationSettings(**{"draft_cutoff": 0.0, "plain_fallback": False, **kwargs})


def plain(pair, prompt, n):
    return Generation(pair, prompt, GenerationSettings(max_new_tokens=n), baseline=True).run()


def mlx_lm_generate(pair, prompt, n):
    """mlx-lm's own greedy generation, with its own caches (a RotatingKVCache for sliding windows)."""
    from mlx_lm.generate import generate_step
    with mx.stream(mx.cpu):
        return [int(tok) for tok, _ in generate_step(mx.array(prompt), pair.target.model, max_tokens=n)]


def test_greedy_dflash_equals_plain_decoding_and_mlx_lm_generate_for_every_block_size(pair):
    prompt = prompt_of(PROMPT_LEN, seed=1)
    ref = plain(pair, prompt, 24).tokens
    assert ref == mlx_lm_generate(pair, prompt, 24)
    for block in range(2, 17):
        run = Generation(pair, prompt, settings(max_new_tokens=24, block_size=block)).run()
        assert run.tokens == ref, f"{pair.name}: block size {block} diverged from plain decoding"
        assert run.stats.drafted == run.stats.steps * (block - 1)


def test_partial_acceptance_rolls_every_cache_back_exactly(pair):
    """The oracle proposes the target's own continuation with every third token wrong, so steps accept
    0..B-1 drafts and every layer kind must forget exactly the rejected positions; 70 tokens past a
    16-token window also make the sliding caches forget old positions several times."""
    prompt = prompt_of(PROMPT_LEN, seed=2)
    ref = plain(pair, prompt, 80).tokens
    for block, wrong in ((8, 3), (16, 7)):
        run = Generation(OraclePair(pair, ref, wrong_every=wrong), prompt,
                         settings(max_new_tokens=70, block_size=block)).run()
        assert run.tokens == ref[:70], f"{pair.name}: block {block} diverged after a partial acceptance"
        assert 0 < run.stats.acceptance_rate < 1
        assert len(set(run.stats.acceptance_lengths)) > 2, "acceptance lengths must vary"
    windows = [c for c in pair.target.caches if isinstance(c, WindowKVCache)]
    if pair.name.endswith("gpt_oss"):
        assert windows and all(c.start > 0 for c in windows), "the sliding caches never forgot old positions"


def snapshot(target) -> dict:
    arrays = {k: mx.array(v) for k, v in cached_tensors(target.caches).items()}
    mx.eval(list(arrays.values()))
    return arrays


@pytest.mark.parametrize("keep", [1, 4, 9])
def test_rollback_leaves_every_cache_as_a_fresh_run_on_the_kept_tokens_would(pair, keep):
    """Tiny random models barely depend on some states, so equal tokens alone could hide a state that
    was not rolled back: compare every cached array, and the next logits, with a fresh run."""
    target = pair.target
    prompt, block = prompt_of(PROMPT_LEN, seed=4), prompt_of(9, seed=5)
    with mx.stream(mx.cpu):
        target.reset()
        target.forward(prompt, features=False)
        target.rollback(PROMPT_LEN)
        target.forward(block, features=False)            # a verify of 9 tokens
        target.rollback(PROMPT_LEN + keep)
        rolled = snapshot(target)
        after, _ = target.forward([7], features=False)
        target.rollback(PROMPT_LEN + keep + 1)
        target.reset()
        target.forward(prompt + block[:keep], features=False)
        target.rollback(PROMPT_LEN + keep)
        fresh = snapshot(target)
        expected, _ = target.forward([7], features=False)
        target.rollback(PROMPT_LEN + keep + 1)
    assert rolled.keys() == fresh.keys() and rolled
    if pair.name.endswith(("qwen3_5", "qwen3_5_moe")):
        assert any(kind == "recurrent" for _, kind in fresh), "a hybrid stand-in must have DeltaNet layers"
    for key, array in fresh.items():
        assert rolled[key].shape == array.shape, f"{pair.name}: {key}"
        assert mx.allclose(rolled[key], array, rtol=1e-4, atol=1e-5).item(), f"{pair.name}: {key} differs"
    assert mx.allclose(after, expected, rtol=1e-4, atol=1e-5).item()


def test_max_tokens_and_eos_inside_a_block(pair):
    prompt = prompt_of(PROMPT_LEN, seed=3)
    ref = plain(pair, prompt, 40).tokens
    for n in (1, 7, 11):
        run = Generation(OraclePair(pair, ref), prompt, settings(max_new_tokens=n, block_size=6)).run()
        assert run.tokens == ref[:n] and run.stop_reason == "length"
    stop_at = next(i for i in range(3, 30) if ref[i] not in ref[:i])
    pair.eos_ids = (ref[stop_at],)
    try:
        fast = Generation(OraclePair(pair, ref), prompt, settings(max_new_tokens=40, block_size=16)).run()
        again = plain(pair, prompt, 40)
    finally:
        pair.eos_ids = ()
    assert fast.tokens == again.tokens == ref[:stop_at]
    assert fast.stop_reason == again.stop_reason == "eos"


def test_each_target_records_only_its_own_layers():
    """Layer taps live in one model instance's layer list: a second pair of the same architecture keeps
    its own capture, and mlx-lm's classes are not touched."""
    from mlx_lm.models.qwen3 import TransformerBlock

    from engine.backends.mlx.target import LayerTap
    call = TransformerBlock.__call__
    a = random_pair("qwen3", seed=5, layers=6)
    b = random_pair("qwen3", seed=5, layers=6)
    a.target.capture([1])
    b.target.capture([2, 4])
    assert TransformerBlock.__call__ is call
    assert [isinstance(x, LayerTap) for x in a.target.layers] == [i == 1 for i in range(6)]
    assert [isinstance(x, LayerTap) for x in b.target.layers] == [i in (2, 4) for i in range(6)]
    prompt = prompt_of(12, seed=6)
    with mx.stream(mx.cpu):
        a.target.reset()
        b.target.reset()
        _, fa = a.target.forward(prompt)
        _, fb = b.target.forward(prompt)
    assert fa.shape == (12, 64) and fb.shape == (12, 128)
    assert mx.allclose(fa, fb[:, :64]).item() is False     # layer 1 of a, layer 2 of b: different layers
