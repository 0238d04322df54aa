"""The CUDA path's Triton kernels (engine/backends/torch/kernels.py) against the torch functions the engine
runs: sampling.prefix_outcome / sampling.verify for verification, draft_runner.block_attention with
block_mask for attention over a cache (the drafter's and the dense target's). On a CPU they run under TRITON_INTERPRET=1 in float32:
`TRITON_INTERPRET=1 pytest -k triton`. bfloat16 and speed need a GPU (the cuda-only test below)."""
import os

import pytest
import torch

from engine.limits import GenerationSettings

interpreted = os.environ.get("TRITON_INTERPRET") == "1"
on_cuda = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not (interpreted or on_cuda),
                                reason="Triton kernels need a GPU or TRITON_INTERPRET=1")
DEVICE = "cuda" if on_cuda and not interpreted else "cpu"


@pytest.fixture(scope="module")
def kernels():
    pytest.importorskip("triton")
    from engine.backends.torch import kernels
    return kernels


def drafts_and_choices(k, accepted, vocab=50, seed=0):
    gen = torch.Generator().manual_seed(seed)
    choices = torch.randint(0, vocab, (k + 1,), generator=gen)
    drafts = choices[:k].clone()
    if accepted < k:
        drafts[accepted] = (choices[accepted] + 1) % vocab
        drafts[accepted + 1:] = torch.randint(0, vocab, (k - accepted - 1,), generator=gen)
    return drafts.to(DEVICE), choices.to(DEVICE)


@pytest.mark.parametrize("k", [0, 1, 7, 9, 15])
def test_triton_greedy_verify_matches_prefix_outcome(kernels, k):
    from engine.backends.torch.sampling import prefix_outcome
    for accepted in sorted({0, k // 2, k}):           # none, some, all accepted
        drafts, choices = drafts_and_choices(k, accepted, seed=k + accepted)
        n, own = prefix_outcome(drafts, choices)
        out = kernels.verify_greedy(drafts, choices).tolist()
        assert out == [accepted, int(choices[accepted])] == [int(n), int(own)]


def test_triton_greedy_verify_agrees_with_the_engine_verify_on_logits(kernels):
    from engine.backends.torch.sampling import verify
    gen = torch.Generator().manual_seed(5)
    for k in (0, 3, 15):
        logits = torch.randn(k + 1, 40, generator=gen)
        best = logits.argmax(-1)
        drafts = best[:k].clone()
        if k:
            drafts[k // 2] = (drafts[k // 2] + 1) % 40
        expected = verify(drafts, None, logits, GenerationSettings(temperature=0.0), None)
        assert tuple(kernels.verify_greedy(drafts.to(DEVICE), best.to(DEVICE)).tolist()) == expected


def sampled_case(k, vocab, seed, accept_all=False):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(k + 1, vocab, generator=gen), -1)
    q = torch.softmax(2 * torch.randn(k, vocab, generator=gen), -1)
    drafts = torch.multinomial(q, 1, generator=gen)[:, 0] if k else torch.zeros(0, dtype=torch.long)
    u = torch.zeros(k) if accept_all else torch.rand(k, generator=gen)
    u2 = torch.rand(1, generator=gen)
    return [t.to(DEVICE) for t in (p, q, drafts, u, u2)]


@pytest.mark.parametrize("k,vocab", [(0, 37), (1, 37), (7, 300), (9, 1000), (15, 2500)])
def test_triton_sampled_verify_matches_its_reference(kernels, k, vocab):
    for seed in range(6):
        case = sampled_case(k, vocab, seed, accept_all=seed == 0)
        got = tuple(kernels.verify_sampled(*case, block_v=256).tolist())
        assert got == kernels.verify_sampled_reference(*case)
        if seed == 0:
            assert got[0] == k                        # u = 0 accepts everything: the bonus comes from p[k]


def test_triton_sampled_verify_rejects_where_the_engine_does_and_draws_from_its_residual(kernels):
    """Same uniforms, same accepted count as sampling.verify; the token has residual mass."""
    from engine.backends.torch.sampling import residual, verify
    settings = GenerationSettings(temperature=1.0, top_k=0, top_p=1.0)
    rejections = 0
    for seed in range(20):
        p, q, drafts, u, u2 = [t.cpu() for t in sampled_case(7, 64, seed)]
        logits = torch.log(p)
        gen = torch.Generator().manual_seed(seed)
        u = torch.rand(7, generator=torch.Generator().manual_seed(seed))   # the engine's first draw
        n_engine, _ = verify(drafts, q, logits, settings, gen)
        p_engine = torch.softmax(logits, -1)
        n, token = kernels.verify_sampled(*(t.to(DEVICE) for t in (p_engine, q, drafts, u, u2))).tolist()
        assert n == n_engine
        row = residual(p_engine[n], q[n]) if n < 7 else p_engine[n]
        assert row[token] > 0
        rejections += n < 7
    assert rejections > 5


def test_inverse_cdf_draws_follow_the_distribution(kernels):
    probs = torch.tensor([0.0, 0.5, 0.0, 0.25, 0.25])
    draws = [int(kernels.inverse_cdf(probs, u)) for u in torch.linspace(0, 0.999, 400)]
    counts = torch.bincount(torch.tensor(draws), minlength=5).float() / 400
    assert counts[0] == counts[2] == 0 and abs(counts[1] - 0.5) < 0.01 and abs(counts[3] - 0.25) < 0.01


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (16, 2)])     # GQA ratios 1, 4, 8
@pytest.mark.parametrize("n", [1, 8, 10, 16])
@pytest.mark.parametrize("context", [0, 1, 37, 70])
@pytest.mark.parametrize("kind", [(None, False), (None, True), (24, False), (24, True), (5, False)])
def test_triton_cached_attention_matches_block_attention(kernels, heads, kv_heads, n, context, kind):
    from engine.backends.torch.draft_runner import block_attention, block_mask
    window, causal = kind
    d = 32 if heads < 16 else 24                         # 24: a head size that is not a power of two
    gen = torch.Generator().manual_seed(heads * 1000 + n * 10 + context)
    end = context + n
    length = end + 13                                    # stale rows past `end` must stay invisible
    q = torch.randn(heads, n, d, generator=gen)
    keys = torch.randn(kv_heads, length, d, generator=gen)
    values = torch.randn(kv_heads, length, d, generator=gen)
    expected = block_attention(q, keys, values, end, block_mask(end, n, window, causal))
    got = kernels.cached_attention(q.to(DEVICE), keys.to(DEVICE), values.to(DEVICE),
                                   torch.tensor([end], device=DEVICE), window, causal)
    tol = 2e-5 if interpreted else 2e-3      # compiled for a GPU, tl.dot on float32 uses TF32
    torch.testing.assert_close(got.cpu(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 1)])
@pytest.mark.parametrize("n", [1, 16])
@pytest.mark.parametrize("end,rows", [(300, 512), (511, 512), (513, 1024), (200, 1024), (700, None)])
@pytest.mark.parametrize("kind", [(None, True), (None, False), (40, True)])
def test_triton_cached_attention_split_across_programs_matches_block_attention(kernels, heads, kv_heads, n,
                                                                               end, rows, kind):
    """A cache longer than SPLIT_ROWS is read by several programs whose shares are combined, including
    splits that lie wholly past `end` (a graph captured for `rows` replayed at a shorter length) and
    splits a sliding window leaves empty."""
    from engine.backends.torch.draft_runner import block_attention, block_mask
    assert (rows or end + 40) > kernels.SPLIT_ROWS
    window, causal = kind
    gen = torch.Generator().manual_seed(end + n)
    length = (rows or end) + 40
    q = torch.randn(heads, n, 16, generator=gen)
    keys = torch.randn(kv_heads, length, 16, generator=gen) * 2
    values = torch.randn(kv_heads, length, 16, generator=gen)
    expected = block_attention(q, keys, values, end, block_mask(end, n, window, causal))
    got = kernels.cached_attention(q.to(DEVICE), keys.to(DEVICE), values.to(DEVICE),
                                   torch.tensor([end], device=DEVICE), window, causal, rows=rows)
    tol = 2e-5 if interpreted else 5e-3      # TF32 products of scores twice the size of the test above
    torch.testing.assert_close(got.cpu(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("max_splits,end,n", [(2, 700, 1), (3, 1000, 16), (2, 700, 40)])
def test_triton_cached_attention_with_few_splits_or_many_queries_matches_block_attention(kernels, max_splits, end, n):
    """Past max_splits each program takes more rows (not a multiple of SPLIT_ROWS); more queries than
    SPLIT_MAX_QUERIES (a prefill chunk) are not split at all."""
    from engine.backends.torch.draft_runner import block_attention, block_mask
    gen = torch.Generator().manual_seed(end + n)
    q = torch.randn(8, n, 16, generator=gen)
    keys = torch.randn(2, end + 30, 16, generator=gen)
    values = torch.randn(2, end + 30, 16, generator=gen)
    expected = block_attention(q, keys, values, end, block_mask(end, n, None, True))
    got = kernels.cached_attention(q.to(DEVICE), keys.to(DEVICE), values.to(DEVICE),
                                   torch.tensor([end], device=DEVICE), None, True, max_splits=max_splits)
    tol = 2e-5 if interpreted else 2e-3
    torch.testing.assert_close(got.cpu(), expected, atol=tol, rtol=tol)


@pytest.mark.skipif(not on_cuda or interpreted, reason="bfloat16 Triton kernels need a GPU (never in CI)")
def test_triton_cached_attention_in_bfloat16_on_cuda(kernels):
    from engine.backends.torch.draft_runner import block_attention, block_mask
    q = torch.randn(32, 16, 128, device="cuda", dtype=torch.bfloat16)
    keys = torch.randn(8, 2100, 128, device="cuda", dtype=torch.bfloat16)
    values = torch.randn(8, 2100, 128, device="cuda", dtype=torch.bfloat16)
    for end, window, causal in [(613, None, False), (613, 256, True), (2013, None, True)]:
        expected = block_attention(q, keys, values, end, block_mask(end, 16, window, causal, device="cuda"))
        got = kernels.cached_attention(q, keys, values, torch.tensor([end], device="cuda"), window, causal)
        torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)
