"""Small randomly initialised targets and drafters, built in memory or on disk, for tests and
benchmarks. No download: the weights are random, so only speed and exactness can be judged."""
from __future__ import annotations

import torch

from .config import DraftConfig
from .drafter import DFlashDrafter
from .target import TargetModel


def target_config(arch: str = "qwen3", vocab: int = 256, hidden: int = 64, layers: int = 4, heads: int = 4,
                  kv_heads: int = 2, intermediate: int | None = None, max_positions: int = 2048,
                  head_dim: int | None = None):
    from transformers import LlamaConfig, Qwen3Config
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, intermediate_size=intermediate or 3 * hidden,
                  max_position_embeddings=max_positions, tie_word_embeddings=False, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)
    if arch == "qwen3":
        return Qwen3Config(head_dim=head_dim or hidden // heads, **common)
    if arch == "llama":
        return LlamaConfig(**common)
    raise ValueError(f"unknown architecture {arch!r}")


def random_target(arch: str = "qwen3", seed: int = 0, capture_layers=(), **sizes) -> TargetModel:
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    cfg = target_config(arch, **sizes)
    cfg._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(cfg)
    return TargetModel(model.float().eval(), capture_layers)


def draft_config_dict(target: TargetModel, layers: int = 1, block_size: int = 16, mask_token_id: int | None = None,
                      target_layer_ids=None, heads: int | None = None, kv_heads: int | None = None,
                      intermediate: int | None = None, nested: bool = True, **extra) -> dict:
    """A z-lab style config for a drafter of this target; attention and MLP shapes follow the target's."""
    h = target.hidden_size
    tcfg = target.model.config
    heads = heads or tcfg.num_attention_heads
    kv_heads = kv_heads or tcfg.num_key_value_heads
    head_dim = h // heads if heads != tcfg.num_attention_heads else getattr(tcfg, "head_dim", None) or h // heads
    if target_layer_ids is None:
        target_layer_ids = sorted({min(i, target.num_layers - 1) for i in (1, target.num_layers // 2, target.num_layers - 2)})
    raw = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": h,
        "intermediate_size": intermediate or tcfg.intermediate_size, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "num_hidden_layers": layers, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "attention_bias": False, "rope_theta": 10000.0, "max_position_embeddings": target.max_positions,
        "vocab_size": target.vocab_rows, "num_target_layers": target.num_layers,
    }
    dflash = {"mask_token_id": target.vocab_rows - 1 if mask_token_id is None else mask_token_id,
              "target_layer_ids": list(target_layer_ids)}
    if nested:
        dflash["block_size"] = block_size
    else:
        raw["block_size"] = block_size
    raw["dflash_config"] = dflash
    raw.update(extra)
    return raw


def random_drafter(target: TargetModel, seed: int = 1, **kwargs) -> DFlashDrafter:
    torch.manual_seed(seed)
    cfg = DraftConfig.from_dict(draft_config_dict(target, **kwargs))
    drafter = DFlashDrafter(cfg)
    with torch.no_grad():  # random weights of a realistic scale so logits are not all ties
        for name, p in drafter.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5 / p.shape[1] ** 0.5)
    target.capture(cfg.target_layer_ids)
    return drafter.float().eval()


def random_pair(arch: str = "qwen3", seed: int = 0, eos_ids=(), draft_layers: int = 1, block_size: int = 16,
                **sizes):
    from .pair import Pair
    target = random_target(arch, seed=seed, **sizes)
    drafter = random_drafter(target, seed=seed + 1, layers=draft_layers, block_size=block_size)
    return Pair(target=target, drafter=drafter, eos_ids=tuple(eos_ids), name=f"random-{arch}")


def byte_tokenizer(chat_template: str | None = None):
    """A byte-level tokenizer with no merges: 256 byte tokens, then <|endoftext|> and <|mask|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet, key=lambda c: ord(c)))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>",
                                  additional_special_tokens=["<|mask|>"])
    if chat_template:
        tok.chat_template = chat_template
    return tok


def save_random_pair(root, arch: str = "qwen3", seed: int = 0, block_size: int = 8, hidden: int = 64,
                     layers: int = 4, draft_layers: int = 1, chat_template: str | None = None):
    """Write target (with tokenizer) and drafter folders under root; returns (target_dir, draft_dir).
    The vocabulary is the byte tokenizer's (258 ids), so text prompts work end to end."""
    from pathlib import Path
    root = Path(root)
    tok = byte_tokenizer(chat_template)
    target = random_target(arch, seed=seed, vocab=len(tok), hidden=hidden, layers=layers)
    target.model.generation_config.eos_token_id = tok.eos_token_id
    target.model.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    mask_id = tok.convert_tokens_to_ids("<|mask|>")
    drafter = random_drafter(target, seed=seed + 1, layers=draft_layers, block_size=block_size,
                             mask_token_id=mask_id)
    drafter.save_pretrained(root / "draft")
    return root / "target", root / "draft"
