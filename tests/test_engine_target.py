"""The target's grouped-head attention must give transformers' own SDPA numbers, for a prefill and
for multi-token verifies after a cache (the case it exists for)."""
import torch

from engine.backends.torch.cpu import GROUPED_SDPA, use_grouped_sdpa
from tests.tiny_torch import random_target


def test_grouped_sdpa_matches_transformers_sdpa():
    ours = random_target("qwen3", seed=4, vocab=80, hidden=64, layers=2)
    theirs = random_target("qwen3", seed=4, vocab=80, hidden=64, layers=2)
    use_grouped_sdpa(ours.model)
    assert ours.model.config._attn_implementation == GROUPED_SDPA
    assert ours.model.config.num_key_value_heads < ours.model.config.num_attention_heads
    ids = torch.randint(0, 80, (1, 30))
    with torch.no_grad():
        for model in (ours, theirs):
            model.reset()
        torch.testing.assert_close(ours.forward(ids[:, :20])[0], theirs.forward(ids[:, :20])[0])
        for chunk in (ids[:, 20:27], ids[:, 27:28], ids[:, 28:]):
            torch.testing.assert_close(ours.forward(chunk)[0], theirs.forward(chunk)[0], atol=1e-5, rtol=1e-4)
