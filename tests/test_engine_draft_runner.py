"""DraftRunner, the packed inference form of the drafter, must compute what the training module
computes: step by step with a growing context, through buffer growth, with sliding layers, after reset."""
import pytest
import torch

from engine.config import DraftConfig
from engine.backends.torch.draft_runner import DraftRunner
from engine.backends.torch.drafter import DFlashDrafter
from tests.tiny_torch import draft_config_dict, random_drafter, random_target


@pytest.fixture(scope="module")
def target():
    return random_target("qwen3", seed=3, vocab=96, hidden=64, layers=4, capture_layers=(1, 3))


def module_hidden(drafter, block, ctx, window=None):
    """The training module over the whole context so far (no cache), with the runner's masks."""
    c, n = ctx.shape[0], block.shape[0]
    block_pos = torch.arange(c, c + n)
    masks = None
    if window:
        key, query = torch.arange(c + n), block_pos.unsqueeze(1)
        masks = {"sliding_attention": ((key > query - window) & (key <= query))[None, None]}
    return drafter(block[None], block_pos[None], ctx[None], torch.arange(c)[None], masks=masks)[0]


def run_steps(drafter, runner, target, context_sizes, window=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = drafter.fc.in_features
    ctx = torch.empty(0, width)
    worst = 0.0
    with torch.no_grad():
        for c in context_sizes:
            new = torch.randn(c, width, generator=gen)
            ctx = torch.cat([ctx, new])
            block = target.embed(torch.randint(0, 96, (8,), generator=gen))
            expected = module_hidden(drafter, block, ctx, window)
            got = runner.hidden(block, new)
            worst = max(worst, (expected - got).abs().max().item())
    return worst


def test_runner_matches_the_module_step_by_step(target):
    drafter = random_drafter(target, layers=2, block_size=8, kv_heads=1).eval()
    runner = DraftRunner(drafter, target.head.weight)
    # the last sizes push the context past the initial 256-position buffers, which then grow
    assert run_steps(drafter, runner, target, [5, 1, 3, 200, 90, 7]) < 1e-4
    runner.reset()
    assert runner.length == 0
    assert run_steps(drafter, runner, target, [9, 2]) < 1e-4


def test_runner_logits_are_the_shared_head_over_slots_after_the_first(target):
    drafter = random_drafter(target, layers=1, block_size=8).eval()
    runner = DraftRunner(drafter, target.head.weight)
    block = target.embed(torch.randint(0, 96, (8,)))
    ctx = torch.randn(4, drafter.fc.in_features)
    with torch.no_grad():
        logits = runner.logits(block, ctx)
        runner.reset()
        hidden = runner.hidden(block, ctx)
    assert logits.shape == (7, 96) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, target.logits(hidden[1:]))


def test_sliding_layers_match_the_module_and_are_causal_inside_the_block(target):
    raw = draft_config_dict(target, layers=2, block_size=8,
                            layer_types=["sliding_attention", "full_attention"], sliding_window=6)
    torch.manual_seed(0)
    drafter = DFlashDrafter(DraftConfig.from_dict(raw)).eval()
    runner = DraftRunner(drafter, target.head.weight)
    assert run_steps(drafter, runner, target, [4, 3, 12], window=6) < 1e-4

    one_layer = DFlashDrafter(DraftConfig.from_dict(
        draft_config_dict(target, layers=1, layer_types=["sliding_attention"], sliding_window=64))).eval()
    block = target.embed(torch.randint(0, 96, (6,)))
    ctx = torch.randn(5, one_layer.fc.in_features)
    changed = block.clone()
    changed[4] += 1.0  # a later slot must not influence earlier ones
    runner = DraftRunner(one_layer, target.head.weight)
    with torch.no_grad():
        a = runner.hidden(block, ctx)
        runner.reset()
        b = runner.hidden(changed, ctx)
    torch.testing.assert_close(a[:4], b[:4])
    assert not torch.allclose(a[4:], b[4:])


def test_bfloat16_runner_stays_close(target):
    drafter = random_drafter(target, layers=2, block_size=8).eval()
    exact = DraftRunner(drafter, target.head.weight)
    half = DraftRunner(drafter, target.head.weight, torch.bfloat16)
    block = target.embed(torch.randint(0, 96, (8,)))
    ctx = torch.randn(6, drafter.fc.in_features)
    with torch.no_grad():
        a, b = exact.logits(block, ctx), half.logits(block, ctx)
    assert b.dtype == torch.float32
    assert (a - b).abs().max() < 0.05 * a.abs().max()
