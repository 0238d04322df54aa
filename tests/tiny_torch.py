"""Small randomly initialised targets and drafters, built in memory or on disk, for tests and
benchmarks. No download: the weights are random, so only speed and exactness can be judged."""
from __future__ import annotations

import torch

from engine.config import DraftConfig
from engine.backends.torch.drafter import DFlashDrafter
from engine.backends.torch.drafter2 import DFlash2Drafter
from engine.backends.torch.dspark import DSparkDrafter
from engine.backends.torch.target import TargetModel


# Tiny stand-ins for every architecture the catalog lists (the name -> its model_type family). Each has
# both kinds of layer its family mixes: sliding and full attention, DeltaNet and full attention, MoE.
VARIANTS = {"qwen3": "qwen3", "llama": "llama", "qwen3_moe": "qwen3_moe", "qwen3_5": "qwen3_5",
            "qwen3_5_moe": "qwen3_5_moe", "gpt_oss": "gpt_oss", "gemma4": "gemma4", "gemma4_moe": "gemma4"}


def target_config(arch: str = "qwen3", vocab: int = 256, hidden: int = 64, layers: int = 4, heads: int = 4,
                  kv_heads: int = 2, intermediate: int | None = None, max_positions: int = 2048,
                  head_dim: int | None = None, window: int = 16):
    """A transformers config of a small model of this variant (VARIANTS); `window` is the sliding window."""
    import transformers as tf
    head_dim = head_dim or hidden // heads
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, intermediate_size=intermediate or 3 * hidden,
                  max_position_embeddings=max_positions, tie_word_embeddings=False, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)
    moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=hidden // 2)
    alternate = [["sliding_attention", "full_attention"][i % 2] for i in range(layers)]
    if arch == "qwen3":
        return tf.Qwen3Config(head_dim=head_dim, **common)
    if arch == "llama":
        return tf.LlamaConfig(**common)
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(head_dim=head_dim, **common, **moe)
    if arch in ("qwen3_5", "qwen3_5_moe"):
        hybrid = dict(head_dim=2 * head_dim, linear_conv_kernel_dim=4, linear_key_head_dim=head_dim,
                      linear_value_head_dim=head_dim, linear_num_key_heads=kv_heads, linear_num_value_heads=heads,
                      layer_types=[["linear_attention", "full_attention"][i % 2] for i in range(layers)],
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                       "mrope_section": [2, 1, 1], "mrope_interleaved": True})
        if arch == "qwen3_5":
            return tf.Qwen3_5TextConfig(**common, **hybrid)
        return tf.Qwen3_5MoeTextConfig(**common, **hybrid, **moe, shared_expert_intermediate_size=hidden // 2)
    if arch == "gpt_oss":
        rope = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": max_positions // 4, "rope_theta": 150000.0}
        return tf.GptOssConfig(head_dim=head_dim, sliding_window=window, layer_types=alternate, rope_parameters=rope,
                               num_local_experts=8, **{k: v for k, v in common.items() if k != "intermediate_size"},
                               intermediate_size=hidden, num_experts_per_tok=2)
    if arch in ("gemma4", "gemma4_moe"):
        common["pad_token_id"] = 0   # Gemma 4's multimodal forward swaps image tokens for padding
        gemma = dict(head_dim=head_dim, global_head_dim=2 * head_dim, sliding_window=window,
                     layer_types=[["sliding_attention", "sliding_attention", "full_attention"][i % 3]
                                  for i in range(layers)], final_logit_softcapping=30.0)
        if arch == "gemma4":   # the small Gemma 4s: per-layer embeddings, the last layers sharing keys/values
            return tf.Gemma4TextConfig(**common, **gemma, hidden_size_per_layer_input=8, vocab_size_per_layer_input=vocab,
                                       num_kv_shared_layers=2, use_double_wide_mlp=True)
        return tf.Gemma4TextConfig(**common, **gemma, hidden_size_per_layer_input=0, enable_moe_block=True,
                                   num_experts=8, top_k_experts=2, moe_intermediate_size=hidden // 2,
                                   attention_k_eq_v=True, num_global_key_value_heads=1)
    raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(VARIANTS)}")


def random_target(arch: str = "qwen3", seed: int = 0, capture_layers=(), **sizes) -> TargetModel:
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    cfg = target_config(arch, **sizes)
    model = AutoModelForCausalLM.from_config(cfg)
    return TargetModel(model.float().eval(), capture_layers)


def draft_config_dict(target: TargetModel, layers: int = 1, block_size: int = 16, mask_token_id: int | None = None,
                      target_layer_ids=None, heads: int | None = None, kv_heads: int | None = None,
                      intermediate: int | None = None, nested: bool = True, **extra) -> dict:
    """A z-lab style config for a drafter of this target; attention and MLP shapes follow the target's."""
    h = target.hidden_size
    tcfg = target.model.config.get_text_config().to_dict()   # a dict: Gemma 4 refuses global per-layer reads
    own_heads = heads or tcfg["num_attention_heads"]
    kv_heads = kv_heads or tcfg["num_key_value_heads"]
    head_dim = (tcfg.get("head_dim") if own_heads == tcfg["num_attention_heads"] else None) or h // own_heads
    heads = own_heads
    if target_layer_ids is None:
        target_layer_ids = sorted({min(i, target.num_layers - 1) for i in (1, target.num_layers // 2, target.num_layers - 2)})
    raw = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": h,
        "intermediate_size": intermediate or tcfg["intermediate_size"], "num_attention_heads": heads,
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


def draft2_config_dict(target: TargetModel, layers: int = 1, block_size: int = 16, top_k: int = 8, rank: int = 16,
                       group: int = 16, kernel: int = 2, window: int = 2048, **extra) -> dict:
    """A DFlash2 config as the published ones write it: every DFlash setting nested, sliding layers that
    are not causal."""
    raw = draft_config_dict(target, layers=layers, block_size=block_size, **extra)
    raw.update(architectures=["DFlash2DraftModel"], is_causal=False, sliding_window=window,
               layer_types=["sliding_attention"] * layers)
    raw["dflash_config"].update(conv_kernel_size=kernel, conv_group_size=group, selector_rank=rank,
                                selector_top_k=top_k)
    return raw


def dspark_config_dict(target: TargetModel, rank: int = 8, sample_from_anchor: bool | None = None, **kwargs) -> dict:
    """A DSpark config in DeepSpec's layout: DFlash's, with the Markov head's rank (and where drafts start, when
    named: the layout's own default is from the anchor)."""
    raw = draft_config_dict(target, **kwargs)
    raw.update(architectures=["DSparkDraftModel"], markov_rank=rank, markov_head_type="vanilla")
    if sample_from_anchor is not None:
        raw["sample_from_anchor"] = sample_from_anchor
    return raw


CONFIG_DICTS = {1: draft_config_dict, 2: draft2_config_dict, 3: dspark_config_dict}
DRAFTER_CLASSES = {1: DFlashDrafter, 2: DFlash2Drafter, 3: DSparkDrafter}


def random_drafter(target: TargetModel, seed: int = 1, generation: int = 1, **kwargs) -> DFlashDrafter:
    torch.manual_seed(seed)
    raw = CONFIG_DICTS[generation](target, **kwargs)
    drafter = DRAFTER_CLASSES[generation](DraftConfig.from_dict(raw))
    with torch.no_grad():  # random weights of a realistic scale so logits are not all ties
        for name, p in drafter.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5 / p.shape[1] ** 0.5)
            elif p.dim() == 3:   # convolution taps: near the identity a fresh one starts at
                p.add_(0.2 * torch.randn_like(p))
    target.capture(drafter.config.target_layer_ids)
    return drafter.float().eval()


def lockstep(pairs, prompt: list[int], settings, steps: int = 6) -> list[list[int]]:
    """Two pairs through the same prefill, drafts and verifies, asserting each step's drafts and outcome equal
    (the same drafts, not only the same output). Returns the drafts of every step."""
    first = [p.prefill(prompt, settings, True) for p in pairs]
    assert first[0] == first[1]
    last, pos, steps_drafted = first[0], len(prompt), []
    for _ in range(steps):
        drafts = [p.draft(last, pos, p.block_size) for p in pairs]
        assert drafts[0] == drafts[1]
        steps_drafted.append(drafts[0])
        outcomes = [p.verify(last, pos, drafts[0]) for p in pairs]
        assert outcomes[0] == outcomes[1]
        n, last = outcomes[0]
        pos += n + 1
        for p in pairs:
            p.commit(pos)
    return steps_drafted


def random_pair(arch: str = "qwen3", seed: int = 0, eos_ids=(), draft_layers: int = 1, block_size: int = 16,
                head_scale: float = 1.0, generation: int = 1, draft_vocab=None, draft_options: dict | None = None,
                **sizes):
    """A loaded pair (as the engine hands it to the loop) of a random target and drafter, no tokenizer.
    head_scale > 1 sharpens the target's distributions (a random target is nearly uniform)."""
    from engine.backends.torch.eager import TorchPair
    target = random_target(arch, seed=seed, **sizes)
    with torch.no_grad():
        target.head.weight.mul_(head_scale)
    drafter = random_drafter(target, seed=seed + 1, generation=generation, layers=draft_layers, block_size=block_size,
                             **(draft_options or {}))
    pair = TorchPair(target, drafter, None, name=f"random-{arch}", family=arch, vocab=draft_vocab)
    pair.eos_ids = tuple(eos_ids)
    return pair


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
                     layers: int = 4, draft_layers: int = 1, chat_template: str | None = None,
                     tokenizer_dir=None, **sizes):
    """Write target (with tokenizer) and drafter folders under root; returns (target_dir, draft_dir).
    The vocabulary is the byte tokenizer's (258 ids), so text prompts work end to end, or the one of the
    tokenizer saved in tokenizer_dir (llama.cpp's converter knows the demo pair's, not the byte one)."""
    from pathlib import Path
    from transformers import AutoTokenizer
    root = Path(root)
    tok = (AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=False) if tokenizer_dir
           else byte_tokenizer(chat_template))
    target = random_target(arch, seed=seed, vocab=len(tok), hidden=hidden, layers=layers, **sizes)
    target.model.generation_config.eos_token_id = tok.eos_token_id
    target.model.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    mask_id = tok.convert_tokens_to_ids("<|mask|>")
    drafter = random_drafter(target, seed=seed + 1, layers=draft_layers, block_size=block_size,
                             mask_token_id=mask_id)
    drafter.save_pretrained(root / "draft")
    return root / "target", root / "draft"


def dspark_from(draft_dir, folder, layers=None, speculators: bool = False, rank: int = 16, scale: float = 0.05,
                seed: int = 0, sample_from_anchor: bool | None = None):
    """A DFlash drafter folder made a DSpark one: its weights with a Markov head random at `scale` (markov_w1: the
    previous token -> rank, markov_w2: rank -> a bias on every token; 0: no bias, so from slot 1 on it drafts what
    its DFlash base drafts) and a confidence head, in DeepSpec's DFlash-lineage config (it drafts from the block's
    first slot, the last token, unless sample_from_anchor says false), or in vLLM speculators' (the backbone's
    config nested, target layers counted from the embeddings, drafts after the last token as DFlash does)."""
    import json
    from pathlib import Path
    from safetensors.torch import load_file, save_file
    weights = load_file(Path(draft_dir) / "model.safetensors")
    cfg = json.loads((Path(draft_dir) / "config.json").read_text(encoding="utf-8"))
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    layers = list(layers or cfg["dflash_config"]["target_layer_ids"])
    g = torch.Generator().manual_seed(seed)
    weights.update({"markov_head.markov_w1.weight": torch.randn(vocab, rank, generator=g) * scale,
                    "markov_head.markov_w2.weight": torch.randn(vocab, rank, generator=g) * scale,
                    "confidence_head.proj.weight": torch.randn(1, h + rank, generator=g) * 0.05,
                    "confidence_head.proj.bias": torch.zeros(1)})
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    if speculators:
        backbone = {k: v for k, v in cfg.items() if k not in ("architectures", "dflash_config", "block_size")}
        cfg = {"architectures": ["DSparkSpeculator"], "transformer_layer_config": backbone, "block_size": 16,
               "mask_token_id": cfg["dflash_config"]["mask_token_id"],
               "aux_hidden_state_layer_ids": [i + 1 for i in layers], "markov_rank": rank}
    else:
        cfg = {**cfg, "architectures": ["DSparkDraftModel"], "markov_rank": rank, "markov_head_type": "vanilla",
               "dflash_config": {**cfg["dflash_config"], "target_layer_ids": layers}}
        if sample_from_anchor is not None:
            cfg["sample_from_anchor"] = sample_from_anchor
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return folder


def dflash2_from(draft_dir, folder, scale: float, seed: int = 0):
    """A DFlash drafter folder as a DFlash2 one, in the public format: its weights, convolutions that start as the
    identity, their dynamic taps and the candidate selector random at `scale` (0: a fresh DFlash2 drafter, which
    drafts what its DFlash base drafts, the selector's top candidate being the base's token)."""
    import json
    from pathlib import Path
    from engine.backends.torch.drafter import load_safetensors_dir
    raw = json.loads((Path(draft_dir) / "config.json").read_text(encoding="utf-8"))
    raw.update(architectures=["DFlash2DraftModel"], is_causal=False, sliding_window=2048,
               layer_types=["sliding_attention"] * raw["num_hidden_layers"])
    raw["dflash_config"].update(conv_kernel_size=2, conv_group_size=16, selector_rank=16, selector_top_k=8)
    drafter = DFlash2Drafter(DraftConfig.from_dict(raw))
    drafter.load_state_dict(load_safetensors_dir(Path(draft_dir)), strict=False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "kernel_projection" in name or "candidate_selector" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    drafter.save_pretrained(folder, dtype=torch.float32)
    ranking = Path(draft_dir) / "draft_vocab.json"
    if ranking.is_file():                      # kept beside it, as a user's folder would keep it
        (Path(folder) / ranking.name).write_bytes(ranking.read_bytes())
    return Path(folder)


def random_eagle3(folder, target_cfg: dict, layers: list[int] | None, seed: int = 0, draft_vocab: int | None = None,
                  scale: float = 0.05, layer_prefix: str = "midlayer.", zero_map: bool = False, **config):
    """A random EAGLE-3 drafter for a target, in SpecForge's layout (LlamaForCausalLMEagle3: one decoder layer over
    [embedding, hidden state], fc from three target layers, its own head). draft_vocab: a head over that many of the
    target's tokens (every other one from token 1 where they fit, else the first ones; a d2t map of offsets and its
    inverse t2d), else all of them;
    layers None leaves the target layers to EAGLE-3's default; layer_prefix names the decoder layer's tensors;
    zero_map writes a d2t of zeros and a t2d of ones beside a full head, as SpecForge does; config adds or replaces
    config.json keys."""
    import json

    from safetensors.torch import save_file
    h, heads, kv = target_cfg["hidden_size"], target_cfg["num_attention_heads"], target_cfg["num_key_value_heads"]
    hd, ff, vocab = target_cfg.get("head_dim") or h // heads, target_cfg["intermediate_size"], target_cfg["vocab_size"]
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g) * scale
    rows = draft_vocab or vocab
    weights = {"fc.weight": rand(h, 3 * h), "norm.weight": torch.ones(h), "lm_head.weight": rand(rows, h),
               "midlayer.input_layernorm.weight": torch.ones(h), "midlayer.hidden_norm.weight": torch.ones(h),
               "midlayer.post_attention_layernorm.weight": torch.ones(h),
               "midlayer.self_attn.q_proj.weight": rand(heads * hd, 2 * h),
               "midlayer.self_attn.k_proj.weight": rand(kv * hd, 2 * h),
               "midlayer.self_attn.v_proj.weight": rand(kv * hd, 2 * h),
               "midlayer.self_attn.o_proj.weight": rand(h, heads * hd),
               "midlayer.mlp.gate_proj.weight": rand(ff, h), "midlayer.mlp.up_proj.weight": rand(ff, h),
               "midlayer.mlp.down_proj.weight": rand(h, ff)}
    if config.get("norm_before_fc"):
        weights["input_norm.weight"] = 1.0 + rand(3 * h)
    weights = {(layer_prefix + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in weights.items()}
    if zero_map:
        weights["d2t"], weights["t2d"] = torch.zeros(vocab, dtype=torch.long), torch.ones(vocab, dtype=torch.bool)
    if draft_vocab:
        step = 2 if 2 * draft_vocab <= vocab else 1
        ids = torch.arange(draft_vocab) * step + step - 1
        weights["d2t"] = ids - torch.arange(draft_vocab)
        weights["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill(0, ids, True)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    raw = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
           "intermediate_size": ff, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
           "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": rows, "hidden_act": "silu",
           "rms_norm_eps": target_cfg.get("rms_norm_eps", 1e-6), "tie_word_embeddings": False,
           "max_position_embeddings": target_cfg["max_position_embeddings"], "rope_theta": 10000.0,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    if layers is not None:
        raw["eagle_aux_hidden_state_layer_ids"] = layers
    raw.update(config)
    (folder / "config.json").write_text(json.dumps(raw), encoding="utf-8")
    return folder


def assert_greedy_at_every_width(pair, prompt: list[int], method: str, max_new_tokens: int = 40, widths=None,
                                 accepting: bool = True) -> None:
    """Every block width (from 2 to the pair's widest, or `widths`) keeps plain decoding's greedy tokens, drafting a
    full block every step with `method`; when accepting, some draft is accepted somewhere (so the
    partial-acceptance paths ran)."""
    from engine.limits import GenerationSettings
    from engine.loop import Generation
    ref = Generation(pair, prompt, GenerationSettings(max_new_tokens=max_new_tokens), baseline=True).run().tokens
    accepted = 0
    for block in widths or range(2, pair.block_size + 1):
        run = Generation(pair, prompt, GenerationSettings(max_new_tokens=max_new_tokens, block_size=block,
                                                          draft_cutoff=0.0, plain_fallback=False)).run()
        assert run.tokens == ref, f"block {block} diverged from plain decoding"
        assert run.stats.drafted == run.stats.steps * (block - 1) and run.stats.speculation == method
        accepted += run.stats.accepted
    assert accepted > 0 or not accepting, "no draft was ever accepted: the partial-acceptance paths did not run"

