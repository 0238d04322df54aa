"""Losslessness of the DFlash loop: greedy DFlash output equals greedy plain decoding, token for token."""
import pytest
import torch

from engine.limits import GenerationSettings
from engine.loop import Generation
from engine.errors import PromptTooLongError, SettingsError
from tests.tiny_torch import random_pair
from tests.oracle import OraclePair


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def pair(request):
    return random_pair(request.param, seed=3, vocab=256, hidden=64, layers=4, max_positions=512)


def prompt_of(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 250, (n,), generator=g).tolist()


def baseline(pair, prompt, n):
    return Generation(pair, prompt, GenerationSettings(max_new_tokens=n), baseline=True).run()


@pytest.mark.parametrize("prompt_len", [1, 17, 200])
def test_random_drafter_matches_baseline_for_every_block_size(pair, prompt_len):
    prompt = prompt_of(prompt_len, seed=prompt_len)
    ref = baseline(pair, prompt, 20)
    assert len(ref.tokens) == 20 and ref.stats.tau == 1.0
    for block in range(2, 17):
        settings = GenerationSettings(max_new_tokens=20, block_size=block, draft_cutoff=0.0, plain_fallback=False)
        run = Generation(pair, prompt, settings).run()
        assert run.tokens == ref.tokens, f"block size {block} diverged from plain decoding"
        assert run.stop_reason == "length"
        assert run.stats.drafted == run.stats.steps * (block - 1)


@pytest.mark.parametrize("cutoff", [1e-6, 0.05, 0.5, 0.99])
def test_draft_cutoff_trims_drafts_but_never_changes_the_output(pair, cutoff):
    prompt = prompt_of(40, seed=5)
    ref = baseline(pair, prompt, 30)
    run = Generation(pair, prompt, GenerationSettings(max_new_tokens=30, draft_cutoff=cutoff, plain_fallback=False)).run()
    assert run.tokens == ref.tokens
    # a random drafter is unsure: the higher the cutoff, the fewer of its 15 drafts get verified
    per_step = run.stats.drafted / run.stats.steps
    assert per_step < 15 if cutoff >= 0.05 else per_step > 0
    if cutoff == 0.99:
        assert run.stats.drafted == 0


def test_confident_prefix_stops_where_the_running_confidence_drops():
    from engine.backends.torch.cpu import confident_prefix
    q = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.8, 0.0], [1.0, 0.0, 0.0]])
    # running product of the top probabilities: 1, 1, 0.5, 0.4, 0.4
    assert [confident_prefix(None, q, c) for c in (0.0, 0.4, 0.45, 0.6)] == [5, 5, 3, 2]
    assert confident_prefix(torch.zeros(3, 4), None, 0.3) == 0      # greedy: softmax of the logits, 0.25 each
    assert confident_prefix(torch.tensor([[9.0, 0, 0, 0]] * 3), None, 0.99) == 3


def test_draft_cutoff_is_automatic_on_a_cpu(pair):
    """On a CPU the engine verifies only drafts the drafter is confident about, unless told otherwise."""
    prompt = prompt_of(40, seed=5)
    auto = Generation(pair, prompt, GenerationSettings(max_new_tokens=30, plain_fallback=False)).run()
    whole = Generation(pair, prompt, GenerationSettings(max_new_tokens=30, draft_cutoff=0.0, plain_fallback=False)).run()
    assert auto.tokens == whole.tokens
    assert whole.stats.drafted == 15 * whole.stats.steps
    assert auto.stats.drafted < 15 * auto.stats.steps  # a random drafter is unsure


@pytest.mark.parametrize("block", [2, 5, 16])
def test_full_acceptance_commits_whole_blocks(pair, block):
    prompt = prompt_of(9, seed=1)
    ref = baseline(pair, prompt, 40 + block)  # the oracle may look one block past the end
    run = Generation(OraclePair(pair, ref.tokens), prompt, GenerationSettings(max_new_tokens=40, block_size=block, plain_fallback=False)).run()
    assert run.tokens == ref.tokens[:40]
    assert run.stats.acceptance_rate == 1.0
    # every step but possibly the one cut by max tokens commits a whole block
    assert all(n == block for n in run.stats.acceptance_lengths[:-1])
    assert run.stats.steps < 40 / block + 2


def test_partial_acceptance_with_planted_mistakes(pair):
    prompt = prompt_of(30, seed=2)
    ref = baseline(pair, prompt, 68)
    run = Generation(OraclePair(pair, ref.tokens, wrong_every=5), prompt, GenerationSettings(max_new_tokens=60, block_size=8, plain_fallback=False)).run()
    assert run.tokens == ref.tokens[:60]
    assert 0 < run.stats.acceptance_rate < 1
    assert set(run.stats.acceptance_lengths) - {8}, "some steps must be cut short by a planted mistake"
    lengths = run.stats.acceptance_lengths  # +1 below: the prefill token; the last step may be cut
    assert sum(lengths[:-1]) + 1 < len(run.tokens) <= sum(lengths) + 1


@pytest.mark.parametrize("max_new", [1, 3, 11, 13])
def test_max_tokens_inside_a_block(pair, max_new):
    prompt = prompt_of(12, seed=4)
    ref = baseline(pair, prompt, 46)
    run = Generation(OraclePair(pair, ref.tokens), prompt, GenerationSettings(max_new_tokens=max_new, block_size=6, plain_fallback=False)).run()
    assert run.tokens == ref.tokens[:max_new]
    assert run.stop_reason == "length"


def test_eos_inside_a_block_stops_before_it(pair):
    for seed in range(5, 50):  # a prompt whose continuation has a fresh token a few steps in
        prompt = prompt_of(12, seed=seed)
        ref = baseline(pair, prompt, 40)
        stop_at = next((i for i in range(4, 15) if ref.tokens[i] not in ref.tokens[:i]), None)
        if stop_at:
            break
    eos = ref.tokens[stop_at]
    pair.eos_ids = (eos,)
    try:
        plain = baseline(pair, prompt, 40)
        fast = Generation(OraclePair(pair, ref.tokens), prompt, GenerationSettings(max_new_tokens=40, block_size=16, plain_fallback=False)).run()
        rand = Generation(pair, prompt, GenerationSettings(max_new_tokens=40, block_size=4)).run()
    finally:
        pair.eos_ids = ()
    assert plain.tokens == ref.tokens[:stop_at] == fast.tokens == rand.tokens
    assert plain.stop_reason == fast.stop_reason == rand.stop_reason == "eos"
    assert fast.stats.steps == 1, "the whole continuation and its EOS fit in one block"


def test_steps_report_origin_of_tokens(pair):
    prompt = prompt_of(5, seed=6)
    ref = baseline(pair, prompt, 34)
    steps = list(Generation(OraclePair(pair, ref.tokens, wrong_every=3), prompt, GenerationSettings(max_new_tokens=30, block_size=4, plain_fallback=False)))
    assert steps[0].drafted == [False]  # the prefill token is the target's
    for step in steps[1:]:
        assert step.drafted == [True] * step.accepted + [False] * (len(step.tokens) - step.accepted)
    assert [t for s in steps for t in s.tokens] == ref.tokens[:30]
    assert steps[-1].stop_reason == "length"


def test_cancel_stops_before_next_step(pair):
    run = Generation(pair, prompt_of(5), GenerationSettings(max_new_tokens=200, block_size=4))
    steps = []
    for step in run:
        steps.append(step)
        if len(steps) == 3:
            run.cancel()
    assert run.stop_reason == "cancelled" and steps[-1].stop_reason == "cancelled"
    assert len(steps) == 4 and len(run.tokens) < 200


def test_context_full_stops_cleanly(pair):
    limit = pair.max_positions
    run = Generation(pair, prompt_of(limit - 5), GenerationSettings(max_new_tokens=50, block_size=16)).run()
    assert run.stop_reason == "context_full"
    assert len(run.prompt) + len(run.tokens) == limit + 1  # the last token needs no cache slot


def test_prompt_longer_than_context_is_refused(pair):
    with pytest.raises(PromptTooLongError, match="context holds 512"):
        Generation(pair, prompt_of(600), GenerationSettings())


@pytest.mark.parametrize("kwargs, text", [
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_k": -3}, "top_k"), ({"block_size": 0}, "block_size"),
])
def test_absurd_settings_are_refused(kwargs, text):
    with pytest.raises(SettingsError, match=text):
        GenerationSettings(**kwargs)


def test_block_size_above_drafter_is_refused(pair):
    with pytest.raises(SettingsError, match="exceeds the drafter's block size 16"):
        Generation(pair, [1, 2], GenerationSettings(block_size=17))


def test_empty_prompt_is_refused(pair):
    with pytest.raises(SettingsError, match="empty"):
        Generation(pair, [], GenerationSettings())


def test_a_drafter_that_is_always_wrong_falls_back_to_plain_decoding(pair):
    """Every draft rejected: each DFlash step commits one token for the price of a draft and a verify,
    so after the fallback's wait the loop switches to plain decoding, with the same output."""
    from engine.loop import FALLBACK_MIN_STEPS
    prompt = prompt_of(20, seed=7)
    ref = baseline(pair, prompt, 60)
    run = Generation(OraclePair(pair, ref.tokens, wrong_every=1), prompt,
                     GenerationSettings(max_new_tokens=60, block_size=8, draft_cutoff=0.0)).run()
    assert run.tokens == ref.tokens
    assert run.fallback is not None and run.stats.fallback == run.fallback
    assert run.stats.drafted == FALLBACK_MIN_STEPS * 7, "no drafts after the fallback"
    assert run.fallback["tau"] == 1.0 and "break-even" in run.fallback["reason"]
    assert run.fallback["after_tokens"] <= FALLBACK_MIN_STEPS + 2   # prefill token, maybe one probe step, the wait


def test_accepted_drafts_never_fall_back(pair):
    prompt = prompt_of(20, seed=8)
    ref = baseline(pair, prompt, 80)
    run = Generation(OraclePair(pair, ref.tokens), prompt,
                     GenerationSettings(max_new_tokens=60, block_size=8, draft_cutoff=0.0)).run()
    assert run.tokens == ref.tokens[:60] and run.fallback is None


@pytest.mark.parametrize("settings", [dict(plain_fallback=False), dict(temperature=0.8, seed=3)],
                         ids=["switched off", "seeded sampling"])
def test_no_fallback_when_switched_off_or_when_a_seed_must_reproduce(pair, settings):
    """A fallback point depends on timing, so a seeded sampled answer (which must come out the same
    every time) never falls back; nor does any answer with the setting off."""
    prompt = prompt_of(20, seed=9)
    run = Generation(pair, prompt, GenerationSettings(max_new_tokens=60, block_size=8, draft_cutoff=0.0,
                                                      **settings)).run()
    assert run.fallback is None and run.stats.drafted == 7 * run.stats.steps
