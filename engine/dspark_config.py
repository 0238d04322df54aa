"""What a DSpark drafter adds to a DFlash config.json (engine/config.py reads the rest), checked on its own so that
a speculators DSpark drafter's import (engine/speculators.py) refuses a head it cannot run before it copies
anything."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import CheckpointError
from .weights import draft_value, whole

# tensors a DSpark export may carry that no engine of ours reads: the confidence head (llama.cpp's draft cutoff)
# and copies of the target's embedding and LM head (every engine takes them from the target)
UNREAD = ("confidence_head.", "embed_tokens.", "lm_head.")


@dataclass(frozen=True)
class DSparkConfig:
    """What a DSpark drafter adds: a Markov head of this rank, and where its block's drafts start. DeepSpec's
    layout (sample_from_anchor, the default) drafts from every slot, the first one (the last committed token's)
    included; otherwise the first slot is passed over and the drafts follow it, as DFlash's do."""
    markov_rank: int
    sample_from_anchor: bool

    @classmethod
    def from_dict(cls, raw: dict[str, Any], vocab: int, source: str) -> "DSparkConfig":
        """Settings read from dflash_config first, then the top level. sample_from_anchor defaults as llama.cpp's
        converter decides: true for DeepSpec's configs, false for one that numbers its target layers as
        speculators' do (aux_hidden_state_layer_ids)."""
        kind = draft_value(raw, "markov_head_type", "vanilla")
        if kind != "vanilla":
            raise CheckpointError(f"{source}: markov_head_type {kind!r} is a DSpark head this version does not "
                                  "compute (it computes 'vanilla'). Pick another drafter or update DFlash Desktop.",
                                  code="unsupported_architecture")
        draft_vocab = draft_value(raw, "draft_vocab_size")
        if draft_vocab is not None and draft_vocab != vocab:
            raise CheckpointError(f"{source}: this DSpark drafter proposes from {draft_vocab!r} of the target's "
                                  f"{vocab} tokens (draft_vocab_size, a d2t map), which only the llama.cpp engine "
                                  "runs. Load the pair with the llama.cpp engine.", code="unsupported_architecture")
        anchor = draft_value(raw, "sample_from_anchor", "aux_hidden_state_layer_ids" not in raw)
        if not isinstance(anchor, bool):
            raise CheckpointError(f"{source}: sample_from_anchor must be true or false, got {anchor!r}.")
        rank = draft_value(raw, "markov_rank")
        if rank is None:
            raise CheckpointError(f"{source} is a DSpark drafter without markov_rank. The checkpoint is "
                                  "incomplete: re-download the drafter.")
        return cls(markov_rank=whole(rank, "markov_rank", source, 1, 1 << 14), sample_from_anchor=anchor)
