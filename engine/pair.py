"""A loaded target + drafter pair, checked for compatibility before anything runs."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch

from .config import DraftConfig
from .draft_runner import DraftRunner, bfloat16_is_faster_here
from .drafter import DFlashDrafter
from .errors import CheckpointError, PairMismatchError
from .target import TargetModel


def check_pair(target: TargetModel, cfg: DraftConfig) -> None:
    """Refuse a drafter that was made for another target, naming what disagrees."""
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
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        raise PairMismatchError(
            f"The drafter reads target layers {list(cfg.target_layer_ids)}, but the target has only "
            f"{target.num_layers} layers (0..{target.num_layers - 1}).")
    if not 0 <= cfg.mask_token_id < target.vocab_rows:
        raise PairMismatchError(
            f"The drafter's mask token id {cfg.mask_token_id} lies outside the target's embedding table "
            f"(0..{target.vocab_rows - 1}); the drafter does not belong to this target.")


def default_dtype(device: str) -> torch.dtype:
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def draft_dtype(device: torch.device) -> torch.dtype | None:
    """bfloat16 for the drafter on CPUs where bfloat16 matrix products run faster (with native bfloat16
    units a demo draft pass takes 38% less time: docs/BENCHMARKS.md, "Step costs"); otherwise the
    drafter's own dtype. The drafter only proposes, so its precision never changes the output."""
    return torch.bfloat16 if device.type == "cpu" and bfloat16_is_faster_here() else None


@dataclass
class Pair:
    target: TargetModel
    drafter: DFlashDrafter | None
    tokenizer: object | None = None
    eos_ids: tuple[int, ...] = ()
    name: str = ""
    info: dict = field(default_factory=dict)

    @cached_property
    def draft_runner(self) -> DraftRunner | None:
        """The drafter packed for inference, built once per pair (see draft_runner.py)."""
        if self.drafter is None:
            return None
        return DraftRunner(self.drafter, self.target.head.weight, draft_dtype(self.target.device))

    @property
    def block_size(self) -> int:
        return self.drafter.config.block_size if self.drafter else 1

    def encode_chat(self, messages: list[dict], raw: bool = False, enable_thinking: bool | None = None) -> list[int]:
        """Token ids for a conversation, through the chat template when the tokenizer has one."""
        tok = self._need_tokenizer()
        if not raw and getattr(tok, "chat_template", None):
            kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return list(ids)
        return list(tok.encode("".join(m["content"] for m in messages), add_special_tokens=False))

    def encode_prompt(self, text: str, raw: bool = False) -> list[int]:
        return self.encode_chat([{"role": "user", "content": text}], raw=raw)

    def decode(self, ids: list[int]) -> str:
        return self._need_tokenizer().decode(ids, skip_special_tokens=True)

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise CheckpointError("The target folder has no tokenizer files; text prompts need tokenizer.json.")
        return self.tokenizer


def eos_ids_of(path: Path, tokenizer) -> tuple[int, ...]:
    ids: set[int] = set()
    try:
        from transformers import GenerationConfig
        eos = GenerationConfig.from_pretrained(str(path)).eos_token_id
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    except (OSError, ValueError):
        pass
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))


def load_pair(target_dir: str | Path, draft_dir: str | Path | None = None, device: str = "cpu",
              dtype: torch.dtype | None = None) -> Pair:
    """Load and check a pair; draft_dir None gives a target-only pair (plain decoding)."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # progress is ours to report, not stderr noise
    dtype = dtype or default_dtype(device)
    target_dir = Path(target_dir)
    cfg = DraftConfig.from_file(Path(draft_dir) / "config.json") if draft_dir else None
    target = TargetModel.from_pretrained(target_dir, dtype=dtype, device=device)
    drafter = None
    if cfg is not None:
        check_pair(target, cfg)
        drafter = DFlashDrafter.from_pretrained(draft_dir, dtype=dtype, device=device)
        target.capture(cfg.target_layer_ids)
    tokenizer = None
    if (target_dir / "tokenizer.json").is_file() or (target_dir / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    return Pair(target=target, drafter=drafter, tokenizer=tokenizer,
                eos_ids=eos_ids_of(target_dir, tokenizer), name=target_dir.name)
