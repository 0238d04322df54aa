"""What an EAGLE-3 drafter's config.json says beyond a DFlash one's (engine/config.py reads the shared keys): which
target layers it reads, how wide its own head is, and where its norms sit. SpecForge's layout
(LlamaForCausalLMEagle3: one Llama decoder layer named `midlayer`) is what the torch and MLX engines compute;
speculators' Eagle3 drafters and others load in llama.cpp only.

Target layers come in two numberings. `eagle_aux_hidden_state_layer_ids` at the top level (speculators', read by
llama.cpp and vLLM) names inputs: id k is the input of the target's layer k, the output of layer k - 1. SpecForge
writes them under `eagle_config` instead, naming outputs (SGLang, its serving engine, adds one to read the input of
the next layer). Without ids the drafter reads the inputs of layers 2, L/2 and L-3 of an L-layer target. We store
inputs and capture outputs as DFlash does, so one capture serves both."""
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
HEADLESS = "lm_head.weight"      # without it the drafter scores with the target's head (full vocabulary only)
OWN_EMBEDDING = "embed_tokens.weight"   # some exports embed with their own table (Llama 3.3 70B's)
# settings that change what the drafter computes and that this version does not compute
REFUSED = {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}


@dataclass(frozen=True)
class Eagle3Config:
    draft_vocab_size: int          # rows of its head; d2t maps row i to target token i + d2t[i]
    aux_layer_ids: tuple[int, ...] | None   # inputs of these layers; None: the default for the target's depth
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
        ids = aux_inputs(raw, source)
        flags = {}
        for key in ("norm_before_residual", "norm_before_fc"):
            flags[key] = raw.get(key, False)
            if not isinstance(flags[key], bool):
                raise CheckpointError(f"{source}: {key} must be true or false, got {flags[key]!r}.")
        return cls(draft_vocab_size=whole(raw.get("draft_vocab_size", vocab), "draft_vocab_size", source, 1, vocab),
                   aux_layer_ids=ids, **flags)

    def capture_layers(self, target_layers: int) -> tuple[int, ...]:
        """The target layers whose outputs the drafter reads, for a target of this depth (the default needs four
        layers or more; a shallower target is refused by the capture, naming its depth)."""
        ids = self.aux_layer_ids or (2, target_layers // 2, max(target_layers - 3, 1))
        return tuple(i - 1 for i in ids)


def aux_inputs(raw: dict[str, Any], source: str = "config.json") -> tuple[int, ...] | None:
    """The target layers whose inputs the drafter reads, from either numbering (the module's docstring); None: the
    default for the target's depth. llama.cpp's converter reads only the top-level key, so SpecForge's nested one is
    handed to it in this numbering (llamacpp/convert.py)."""
    nested = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
    ids, key, first = raw.get("eagle_aux_hidden_state_layer_ids"), "eagle_aux_hidden_state_layer_ids", 1
    if ids is None and nested.get(key) is not None:    # SpecForge's: outputs, so the next layers' inputs
        ids, key, first = nested[key], f"eagle_config.{key}", 0
    if ids is None:
        return None
    if not (isinstance(ids, list) and len(ids) == 3 and all(type(i) is int and first <= i < 1024 for i in ids)):
        raise CheckpointError(f"{source}: {key} must name three target layers from {first} up, got {ids!r}. "
                              "Re-download the drafter.")
    return tuple(i + 1 - first for i in ids)


LAYER = ("midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
         *(f"midlayer.self_attn.{x}_proj.weight" for x in "qkvo"),
         *(f"midlayer.mlp.{x}_proj.weight" for x in ("gate", "up", "down")))
ALIASES = ("layers.0.",)     # the decoder layer's other name in some exports (AngelSlim's, speculators')


def renamed(name: str) -> str:
    """A tensor's name in SpecForge's layout (`midlayer.`), whatever prefix the export gave its one layer."""
    alias = next((a for a in ALIASES if name.startswith(a)), None)
    return "midlayer." + name[len(alias):] if alias else name


def layout_problem(cfg, names) -> str | None:
    """What keeps tensors with these names from being SpecForge's layout for this config (names renamed and the
    unread ones left out), in words; None when they are."""
    names = {renamed(n) for n in names if not n.startswith(UNREAD)}
    required = {"fc.weight", "norm.weight", *LAYER, *(("input_norm.weight",) if cfg.eagle3.norm_before_fc else ()),
                *((HEADLESS, "d2t") if cfg.own_head_size else ())}
    unknown = sorted(names - required - {HEADLESS, OWN_EMBEDDING, "d2t"})
    missing = sorted(required - names)
    if not unknown and not missing:
        return None
    return "; ".join([*([f"unknown tensors {', '.join(unknown[:3])}"] if unknown else []),
                      *([f"no {', '.join(missing[:3])}"] if missing else [])])


def parts(cfg, names) -> dict:
    """The optional parts a checkpoint with these tensors has, as the drafter modules take them: its own head
    (else the target's), its own embedding, a d2t map (a full-vocabulary export may carry one of zeros)."""
    return {"own_head": HEADLESS in names, "own_embedding": OWN_EMBEDDING in names,
            "mapped": "d2t" in names or cfg.own_head_size is not None}


def checked_targets(ids: list[int], vocab: int) -> bool:
    """Whether a d2t map's target tokens (row i + d2t[i]) matter: False for the map of a head over the whole
    vocabulary in order (row i is token i, an export's zeros). Refused where they fall outside the target's
    vocabulary or twice on one token: the drafter would draft tokens nobody can verify."""
    if any(not 0 <= i < vocab for i in ids) or len(set(ids)) != len(ids):
        raise CheckpointError("This EAGLE-3 drafter's d2t map sends its tokens outside the target's vocabulary or "
                              "two of them to one token. The checkpoint is damaged: re-download it.")
    return ids != list(range(vocab))


class Loading:
    """What both engines' EAGLE-3 modules (torch's and MLX's eagle3.py) do alike when they load by name: the layer's
    names as SpecForge writes them, the layout checked before anything is built (one only llama.cpp reads is refused
    naming it), which optional parts to build, and the d2t check once loaded (target_ids)."""

    renamed = staticmethod(renamed)

    @staticmethod
    def layers_in(header: dict) -> int:
        return 1        # config.json says one (Eagle3Config); a layout without it is named by shaped

    @classmethod
    def shaped(cls, cfg, header: dict):
        problem = layout_problem(cfg, header)
        if problem:
            raise CheckpointError(f"This EAGLE-3 drafter is not in SpecForge's layout, the one the torch and MLX "
                                  f"engines read ({problem}). Load the pair with the llama.cpp engine.",
                                  code="unsupported_architecture")
        return cls(cfg, **parts(cfg, header))

    @classmethod
    def from_pretrained(cls, path, *args, **kwargs):
        drafter = super().from_pretrained(path, *args, **kwargs)
        drafter.target_ids()
        return drafter
