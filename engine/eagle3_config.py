"""What an EAGLE-3 drafter's config.json says beyond a DFlash one's (engine/config.py reads the shared keys): which
target layers it reads, how wide its own head is, and where its norms sit. SpecForge's layout
(LlamaForCausalLMEagle3: one Llama decoder layer named `midlayer`) is what the torch and MLX engines compute;
speculators' Eagle3 drafters and others load in llama.cpp only.

Target layers follow EAGLE-3's numbering, as llama.cpp and vLLM read it: id k is the input of the target's layer k
(the output of layer k - 1), and without ids the drafter reads layers 2, L/2 and L-3 of an L-layer target. We store
them as DFlash does (outputs of layers), so one capture serves both."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import CheckpointError
from .weights import whole

# an EAGLE-3 drafter drafts one token per pass of its layer; a step proposes up to this many before the target
# verifies them (the loop's width, set per answer, may ask for fewer)
CHAIN = 7
# tensors a SpecForge export may carry that decoding does not read (t2d is d2t's inverse)
UNREAD = ("t2d",)
# settings that change what the drafter computes and that this version does not compute
REFUSED = {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}


@dataclass(frozen=True)
class Eagle3Config:
    draft_vocab_size: int          # rows of its head; d2t maps row i to target token i + d2t[i]
    aux_layer_ids: tuple[int, ...] | None   # EAGLE-3's numbering; None: the default for the target's depth
    norm_before_residual: bool     # the residual around attention is the normed target features (speculators)
    norm_before_fc: bool           # the three target layers are normed (input_norm) before fc

    @classmethod
    def from_dict(cls, raw: dict[str, Any], vocab: int, source: str) -> "Eagle3Config":
        for key, bad in REFUSED.items():
            if raw.get(key) == bad:
                raise CheckpointError(f"{source}: {key} is {bad}, which the torch and MLX engines' EAGLE-3 "
                                      "drafter does not compute. Load the pair with the llama.cpp engine.",
                                      code="unsupported_architecture")
        if raw.get("num_hidden_layers") != 1:
            raise CheckpointError(f"{source}: an EAGLE-3 drafter has one decoder layer, this one says "
                                  f"{raw.get('num_hidden_layers')!r}. Re-download the drafter.")
        if raw.get("target_hidden_size", raw.get("hidden_size")) != raw.get("hidden_size"):
            raise CheckpointError(f"{source}: target_hidden_size {raw.get('target_hidden_size')!r} differs from the "
                                  "drafter's hidden_size, which the torch and MLX engines' EAGLE-3 drafter does not "
                                  "compute. Load the pair with the llama.cpp engine.", code="unsupported_architecture")
        ids = raw.get("eagle_aux_hidden_state_layer_ids")
        if ids is not None:
            if not (isinstance(ids, list) and len(ids) == 3 and all(type(i) is int and 1 <= i < 1024 for i in ids)):
                raise CheckpointError(f"{source}: eagle_aux_hidden_state_layer_ids must name three target layers "
                                      f"from 1 up, got {ids!r}. Re-download the drafter.")
            ids = tuple(ids)
        flags = {}
        for key in ("norm_before_residual", "norm_before_fc"):
            flags[key] = raw.get(key, False)
            if not isinstance(flags[key], bool):
                raise CheckpointError(f"{source}: {key} must be true or false, got {flags[key]!r}.")
        return cls(draft_vocab_size=whole(raw.get("draft_vocab_size", vocab), "draft_vocab_size", source, 1, vocab),
                   aux_layer_ids=ids, **flags)

    def capture_layers(self, target_layers: int) -> tuple[int, ...]:
        """The target layers whose outputs the drafter reads, for a target of this depth."""
        ids = self.aux_layer_ids or (2, target_layers // 2, target_layers - 3)
        return tuple(i - 1 for i in ids)
