"""Whether a drafter belongs to a target, from their configs alone: shared by every engine that runs
our drafter (torch, mlx). Pure standard library."""
from __future__ import annotations

from .config import DraftConfig
from .errors import PairMismatchError


def check_pair(target, cfg: DraftConfig) -> None:
    """Refuse a drafter that was made for another target, naming what disagrees. target: anything with
    hidden_size, vocab_rows (embedding rows) and num_layers."""
    if cfg.hidden_size != target.hidden_size:
        raise PairMismatchError(
            f"The drafter's hidden size is {cfg.hidden_size} but the target's is {target.hidden_size}: "
            "this drafter was trained for a different model. Pick the drafter made for this target.")
    if cfg.vocab_size != target.vocab_rows:
        raise PairMismatchError(
            f"The drafter expects a vocabulary of {cfg.vocab_size} tokens but the target has "
            f"{target.vocab_rows}: they use different tokenizers. Pick the drafter made for this target.")
    if cfg.num_target_layers is not None and cfg.num_target_layers != target.num_layers:
        raise PairMismatchError(
            f"The drafter was trained on a {cfg.num_target_layers}-layer target but this target has "
            f"{target.num_layers} layers. Pick the drafter made for this target.")
    if not 0 <= cfg.mask_token_id < target.vocab_rows:
        raise PairMismatchError(
            f"The drafter's mask token id {cfg.mask_token_id} lies outside the target's embedding table "
            f"(0..{target.vocab_rows - 1}); the drafter does not belong to this target.")
    deepest = max(cfg.eagle3.aux_layer_ids or (0,)) if cfg.eagle3 is not None else 0
    if deepest > target.num_layers:
        raise PairMismatchError(
            f"The drafter reads target layers eagle_aux_hidden_state_layer_ids {list(cfg.eagle3.aux_layer_ids)}, but "
            f"the target has only {target.num_layers} layers: this drafter belongs to a deeper model. Pick the "
            "drafter made for this target.")
