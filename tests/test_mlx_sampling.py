"""Exact speculative sampling on the MLX engine: DFlash's samples follow the target's own distribution
(chi-square over every 3-token continuation of a 6-token vocabulary), also over a Gated DeltaNet target
and with top-k, top-p and a draft cutoff."""
import itertools

import pytest

mx = pytest.importorskip("mlx.core", reason="the mlx engine needs mlx (pip install 'dflash-desktop[mlx]')")
from scipy.stats import chisquare  # noqa: E402

from engine.backends.mlx.sampling import probabilities  # noqa: E402
from tests.tiny_mlx import random_pair  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402

VOCAB = 6
PROMPT = [1, 4, 2]


def tiny_vocab(arch: str, seed: int):
    # a random target is nearly uniform; sharpen it so wrong samplers show
    return random_pair(arch, seed=seed, vocab=VOCAB, hidden=32, layers=2, heads=2, kv_heads=1, block_size=4,
                       head_scale=6.0)


@pytest.fixture(scope="module")
def tiny_vocab_pair():
    return tiny_vocab("qwen3", 11)


def exact_distribution(pair, settings: GenerationSettings, steps: int):
    """P(t1..t_steps) computed directly from the target, by enumerating every continuation."""
    target = pair.target
    dist = {}

    def cond(prefix):
        target.reset()
        logits, _ = target.forward(PROMPT + list(prefix), last_only=True, features=False)
        return probabilities(logits, settings)[0].tolist()
    with mx.stream(mx.cpu):
        for seq in itertools.product(range(VOCAB), repeat=steps):
            p = 1.0
            for i in range(steps):
                p *= cond(seq[:i])[seq[i]]
            dist[seq] = p
    return dist


def sample_many(pair, settings: GenerationSettings, n: int):
    counts, accepted, drafted = {}, 0, 0
    for seed in range(n):
        run = Generation(pair, PROMPT, GenerationSettings(**{**settings.__dict__, "seed": seed})).run()
        key = tuple(run.tokens)
        counts[key] = counts.get(key, 0) + 1
        accepted += run.stats.accepted
        drafted += run.stats.drafted
    return counts, accepted / max(drafted, 1)


def assert_follows_the_target(pair, settings: GenerationSettings, n: int = 2500):
    counts, _ = sample_many(pair, settings, n)
    exact = exact_distribution(pair, settings, 3)
    # chi-square over cells with enough expected mass; the rest pooled into one cell
    big = [k for k, p in exact.items() if p * n >= 5]
    observed = [counts.get(k, 0) for k in big]
    expected = [exact[k] * n for k in big]
    rest_obs, rest_exp = n - sum(observed), n - sum(expected)
    if rest_exp >= 5:
        observed.append(rest_obs)
        expected.append(rest_exp)
    else:
        assert rest_obs <= 10, "samples fell where the target puts (almost) no mass"
        scale = sum(observed) / sum(expected)
        expected = [e * scale for e in expected]
    assert len(big) >= 8, "the test needs a spread distribution to mean anything"
    result = chisquare(observed, expected)
    assert result.pvalue > 0.001, f"DFlash sampling deviates from the target (p={result.pvalue:.2g})"


@pytest.mark.parametrize("temperature, top_k, top_p, cutoff", [(1.0, 0, 1.0, 0.0), (0.7, 4, 0.9, 0.0),
                                                               (1.0, 0, 1.0, 0.3)])
def test_dflash_samples_follow_the_target_distribution(tiny_vocab_pair, temperature, top_k, top_p, cutoff):
    """Also with a draft cutoff, which must decide how many drafts to verify without looking at them."""
    assert_follows_the_target(tiny_vocab_pair, GenerationSettings(
        max_new_tokens=3, temperature=temperature, top_k=top_k, top_p=top_p, block_size=4, draft_cutoff=cutoff))


def test_samples_of_a_hybrid_target_follow_its_distribution():
    """Speculative sampling over a Gated DeltaNet target (test_mlx_architectures compares the rolled-back
    state itself)."""
    pair = tiny_vocab("qwen3_5", 12)
    assert pair.target.deltanet is not None
    assert_follows_the_target(pair, GenerationSettings(max_new_tokens=3, temperature=1.0, block_size=4,
                                                       draft_cutoff=0.0))


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = mx.array([[4.0, 3.0, 2.0, 1.0, 0.0]])
    top2 = probabilities(logits, GenerationSettings(temperature=1.0, top_k=2))[0].tolist()
    assert top2[2:] == [0.0, 0.0, 0.0] and abs(sum(top2) - 1) < 1e-6
    p = probabilities(logits, GenerationSettings(temperature=1.0))[0].tolist()
    nucleus = probabilities(logits, GenerationSettings(temperature=1.0, top_p=p[0] + 0.01))[0].tolist()
    assert nucleus[2:] == [0.0, 0.0, 0.0] and nucleus[0] > nucleus[1] > 0


def test_residual_rule_accepts_more_than_sample_and_match(tiny_vocab_pair):
    base = dict(max_new_tokens=12, temperature=1.0, block_size=4, plain_fallback=False)
    _, residual = sample_many(tiny_vocab_pair, GenerationSettings(**base, rule="residual"), 150)
    _, match = sample_many(tiny_vocab_pair, GenerationSettings(**base, rule="match"), 150)
    assert residual > match + 0.05, f"residual {residual:.3f} vs match {match:.3f}"


def test_seeded_runs_are_reproducible(tiny_vocab_pair):
    s = GenerationSettings(max_new_tokens=20, temperature=1.0, seed=123, block_size=4)
    a = Generation(tiny_vocab_pair, PROMPT, s).run().tokens
    b = Generation(tiny_vocab_pair, PROMPT, s).run().tokens
    c = Generation(tiny_vocab_pair, PROMPT, GenerationSettings(**{**s.__dict__, "seed": 124})).run().tokens
    assert a == b
    assert a != c


def test_top_k_one_is_greedy(tiny_vocab_pair):
    greedy = Generation(tiny_vocab_pair, PROMPT, GenerationSettings(max_new_tokens=10), baseline=True).run().tokens
    topk1 = Generation(tiny_vocab_pair, PROMPT, GenerationSettings(max_new_tokens=10, temperature=1.0, top_k=1,
                                                                 seed=5)).run().tokens
    assert greedy == topk1


def test_samples_drafted_from_a_draft_vocabulary_follow_the_target():
    """The subset's renormalised distribution, zero elsewhere, is the proposal: still exact."""
    from engine.draft_vocab import DraftVocab
    pair = random_pair("qwen3", seed=11, vocab=VOCAB, hidden=32, layers=2, heads=2, kv_heads=1, block_size=4,
                       head_scale=6.0, draft_vocab=DraftVocab((3, 1, 5, 0), VOCAB))
    assert_follows_the_target(pair, GenerationSettings(max_new_tokens=3, temperature=1.0, block_size=4,
                                                       draft_vocab=2))
    assert pair.draft_vocab == 2
