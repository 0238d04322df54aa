"""EAGLE-3 drafters in the torch engine (SpecForge's layout, tests/tiny_torch.py random_eagle3): the config's target
layers read as llama.cpp and vLLM read them, a checkpoint loads by name and a damaged one is refused by name, the
runner's cached chain drafts what a plain recomputation of llama.cpp's graph drafts at every step of an answer
(rejections and rollbacks included, with a head over a subset of the vocabulary and both norm options), greedy
output is plain decoding's, sampling follows the target's distribution (chi-square), and "auto" sends such a
drafter to torch on a GPU, to llama.cpp on a CPU. SmolLM2 (a real model) with one: tests/test_chat_pair.py."""
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from engine.backends.torch.eagle3 import Eagle3Drafter, Eagle3Runner
from engine.backends.torch.eager import TorchPair
from engine.backends.torch.engine import load_pair
from engine.bench import DEMO_DIR
from engine.config import DraftConfig
from engine.errors import CheckpointError, PairMismatchError
from engine.limits import GenerationSettings
from engine.loop import Generation
from tests.test_engine_sampling import assert_follows_the_target
from tests.tiny_torch import assert_greedy_at_every_width, lockstep, random_eagle3, random_target

TARGET = DEMO_DIR / "target"
CODE = ["def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n", "import os\nimport sys\n\n\ndef main():\n"]


def target_dict(target) -> dict:
    return target.model.config.to_dict()


def eagle3_pair(tmp_path, seed: int = 0, head_scale: float = 6.0, vocab: int = 48, **options):
    """A sharp random qwen3 target and a random EAGLE-3 drafter for it, saved and loaded by name."""
    target = random_target("qwen3", seed=seed, vocab=vocab, hidden=64, layers=5, heads=4, kv_heads=2,
                           max_positions=512)
    with torch.no_grad():
        target.head.weight.mul_(head_scale)
    folder = random_eagle3(tmp_path / f"eagle3-{seed}", target_dict(target), options.pop("layers", [1, 3, 5]),
                           seed=seed + 1, scale=options.pop("scale", 0.3), **options)
    drafter = Eagle3Drafter.from_pretrained(folder)
    target.capture(drafter.config.capture_layers(target.num_layers))
    pair = TorchPair(target, drafter, None, name="random-eagle3", family="qwen3")
    pair.runner = Eagle3Runner(drafter, target.head.weight)     # float32 (a CPU may pick bfloat16) to compare
    return pair


def test_target_layers_are_read_as_inputs_of_the_layers_named_with_a_default_for_the_targets_depth(tmp_path):
    cfg = json.loads((TARGET / "config.json").read_text())
    named = DraftConfig.from_file(random_eagle3(tmp_path / "a", cfg, [1, 3, 6]) / "config.json")
    assert (named.generation, named.capture_layers(6), named.verify_width) == (4, (0, 2, 5), 8)
    default = DraftConfig.from_file(random_eagle3(tmp_path / "b", cfg, None) / "config.json")
    assert default.capture_layers(32) == (1, 15, 28) and default.capture_layers(6) == (1, 2, 2)
    assert default.eagle3.draft_vocab_size == cfg["vocab_size"] and not default.eagle3.norm_before_residual


def test_specforges_own_numbering_and_layouts_load(tmp_path):
    """SpecForge writes its layer ids under eagle_config, naming outputs (SGLang reads the next layers' inputs), and
    a head over the whole vocabulary with a d2t of zeros; some exports name the layer layers.0: all load, the map of
    zeros changes nothing, and the renamed layer drafts what the same weights under midlayer draft."""
    cfg = json.loads((TARGET / "config.json").read_text())
    nested = random_eagle3(tmp_path / "n", cfg, None, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 4]})
    assert DraftConfig.from_file(nested / "config.json").capture_layers(6) == (0, 2, 4)
    both = random_eagle3(tmp_path / "b", cfg, [2, 3, 4], eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 4]})
    assert DraftConfig.from_file(both / "config.json").capture_layers(6) == (1, 2, 3)     # the top level first
    zeros = Eagle3Drafter.from_pretrained(random_eagle3(tmp_path / "z", cfg, [1, 3, 5], zero_map=True))
    assert zeros.target_ids() is None and zeros.config.own_head_size is None
    pairs = [load_pair(TARGET, random_eagle3(tmp_path / name, cfg, [1, 3, 5], layer_prefix=prefix), device="cpu")
             for name, prefix in (("mid", "midlayer."), ("layers", "layers.0."))]
    for pair in pairs:
        pair.runner = Eagle3Runner(pair.drafter, pair.target.head.weight)
    lockstep(pairs, pairs[0].tokenizer.encode_prompt(CODE[0], raw=True), GenerationSettings(draft_cutoff=0.0))


def test_a_layout_only_llamacpp_reads_is_refused_naming_it_and_auto_sends_it_there(tmp_path):
    """Tensors of another layout (a Qwen3-style layer's q_norm, a layer named model.layers.0) are refused before
    anything is built, naming llama.cpp; "auto" sends such a drafter there on any device."""
    from engine.backends.choice import auto_engine
    cfg = json.loads((TARGET / "config.json").read_text())
    folder = random_eagle3(tmp_path / "q", cfg, [1, 3, 5])
    save_file({**load_file(folder / "model.safetensors"), "midlayer.self_attn.q_norm.weight": torch.ones(32)},
              folder / "model.safetensors")
    other = random_eagle3(tmp_path / "m", cfg, [1, 3, 5], layer_prefix="model.layers.0.")
    for drafter, words in ((folder, "unknown tensors midlayer.self_attn.q_norm"), (other, "no fc.weight|no midlayer")):
        with pytest.raises(CheckpointError, match=f"not in SpecForge's layout.*({words})"):
            Eagle3Drafter.from_pretrained(drafter)
        assert auto_engine(TARGET, "cuda", drafter) == auto_engine(TARGET, "cpu", drafter) == "llamacpp"


@pytest.mark.parametrize("change, words", [
    ({"eagle_aux_hidden_state_layer_ids": [0, 3, 5]}, "three target layers from 1 up"),
    ({"eagle_aux_hidden_state_layer_ids": [1, 3]}, "three target layers"),
    ({"attention_bias": True}, "llama.cpp engine"),
    ({"tie_word_embeddings": True}, "llama.cpp engine"),
    ({"num_hidden_layers": 2}, "one decoder layer"),
    ({"norm_before_residual": "yes"}, "norm_before_residual must be true or false"),
    ({"draft_vocab_size": 1 << 20}, "draft_vocab_size"),
    ({"target_hidden_size": 512}, "target_hidden_size"),
])
def test_config_errors_name_the_key(tmp_path, change, words):
    cfg = json.loads((TARGET / "config.json").read_text())
    folder = random_eagle3(tmp_path / "d", cfg, [1, 3, 5], **change)
    with pytest.raises(CheckpointError, match=words):
        DraftConfig.from_file(folder / "config.json")


def test_damaged_checkpoints_are_refused_by_name(tmp_path):
    cfg = json.loads((TARGET / "config.json").read_text())
    folder = random_eagle3(tmp_path / "d", cfg, [1, 3, 5], draft_vocab=100)
    weights = load_file(folder / "model.safetensors")
    assert Eagle3Drafter.from_pretrained(folder).target_ids().tolist() == list(range(1, 200, 2))   # t2d unread
    for name, change, words in [("d2t", lambda w: w.sub(5), "outside the target's vocabulary"),
                                ("d2t", lambda w: -torch.arange(len(w)), "two of them to one token"),
                                ("lm_head.weight", None, "no lm_head.weight"),
                                ("midlayer.mlp.up_proj.weight", None, "no midlayer.mlp.up_proj.weight"),
                                ("fc.weight", lambda w: w[:, :64], "has shape")]:
        broken = dict(weights)
        if change is None:
            del broken[name]
        else:
            broken[name] = change(broken[name]).contiguous()
        save_file(broken, folder / "model.safetensors")
        with pytest.raises(CheckpointError, match=words):
            Eagle3Drafter.from_pretrained(folder).target_ids()


def test_a_drafter_for_a_deeper_target_is_refused_naming_its_layers(tmp_path):
    cfg = json.loads((TARGET / "config.json").read_text())
    with pytest.raises(PairMismatchError, match=r"eagle_aux_hidden_state_layer_ids \[1, 3, 9\]"):
        load_pair(TARGET, random_eagle3(tmp_path / "deep", cfg, [1, 3, 9]), device="cpu")


def reference_drafts(pair, sequence: list[int], count: int) -> list[int]:
    """Greedy drafts after `sequence` (its last token is the newest, not yet verified), computed from scratch with
    the drafter module's own weights as llama.cpp's graph reads them: position P holds the token at P+1 beside the
    target's features at P (fc of three layers); each draft's pre-norm output is the hidden state of the next
    position, beside the draft; causal attention over every position so far, no cache."""
    target, drafter = pair.target, pair.drafter
    target.reset()
    _, feats = target.forward(torch.tensor([sequence[:-1]]))
    target.reset()
    layer, attn, e = drafter.midlayer, drafter.midlayer.self_attn, drafter.config.eagle3
    ids = drafter.target_ids()
    if e.norm_before_fc:
        feats = drafter.input_norm(feats)
    hidden = drafter.fc(feats)                       # [n, H], one row per committed position but the newest
    tokens = list(sequence[1:])
    drafts = []
    for _ in range(count):
        n = hidden.shape[0]
        normed = layer.hidden_norm(hidden)
        x = torch.cat([layer.input_layernorm(target.embed(torch.tensor(tokens))), normed], dim=-1)
        q = attn.q_proj(x).view(n, attn.heads, attn.head_dim).transpose(0, 1)
        k = attn.k_proj(x).view(n, attn.kv_heads, attn.head_dim).transpose(0, 1)
        v = attn.v_proj(x).view(n, attn.kv_heads, attn.head_dim).transpose(0, 1)
        cos, sin = drafter.rotary(x[None], torch.arange(n)[None])
        q, k = (t * cos + rotate(t) * sin for t in (q, k))
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)[0]
        h = (normed if e.norm_before_residual else hidden) + attn.o_proj(out.transpose(0, 1).reshape(n, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = F.linear(drafter.norm(h[-1]), drafter.lm_head.weight)
        column = int(logits.argmax())
        drafts.append(column if ids is None else int(ids[column]))
        hidden = torch.cat([hidden, h[-1:]])
        tokens.append(drafts[-1])
    return drafts


def rotate(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


@pytest.mark.parametrize("seed, options", [(4, {}), (4, {"draft_vocab": 20}),
                                           (7, {"norm_before_residual": True, "norm_before_fc": True,
                                                "layers": [2, 4, 5]})])
def test_the_cached_chain_drafts_what_a_recomputation_drafts_at_every_step(tmp_path, seed, options):
    """Steps of a greedy answer through the engine's calls, the verify keeping some drafts and rejecting others
    (seeds where it does): every step's drafts equal the from-scratch reference's for the tokens committed so far."""
    pair = eagle3_pair(tmp_path, seed=seed, **options)
    settings = GenerationSettings(max_new_tokens=60, draft_cutoff=0.0)
    prompt = torch.randint(1, 47, (11,), generator=torch.Generator().manual_seed(2)).tolist()
    sequence = prompt + [pair.prefill(prompt, settings, True)]
    record, kept = [], []
    for _ in range(8):
        drafts = pair.draft(sequence[-1], len(sequence) - 1, 6)
        record.append((list(sequence), drafts))
        n, own = pair.verify(sequence[-1], len(sequence) - 1, drafts)
        kept.append(n)
        sequence += [*drafts[:n], own]
        pair.commit(len(sequence) - 1)
    assert all(len(d) == 5 for _, d in record)
    assert any(0 < n < 5 for n in kept), f"no step kept some drafts and rejected the rest ({kept})"
    for seq, drafts in record:
        assert drafts == reference_drafts(pair, seq, 5), f"after {len(seq)} tokens"
    if "draft_vocab" in options:
        assert all(t % 2 == 1 and t < 40 for _, d in record for t in d)     # only the head's own tokens


def test_greedy_eagle3_equals_plain_decoding_at_every_width(tmp_path):
    pair = eagle3_pair(tmp_path, seed=7)
    assert pair.info["methods"] == ["none", "ngram", "eagle3"] and pair.info["drafter_generation"] == 4
    prompt = torch.randint(1, 47, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    assert_greedy_at_every_width(pair, prompt, "eagle3")


@pytest.mark.parametrize("draft_vocab", [None, 2])
def test_eagle3_samples_follow_the_target_distribution(tmp_path, draft_vocab):
    """Each draft is drawn from the drafter's distribution given the drafts before it, which is the proposal the
    residual rule checks; over a head of two of the six tokens too (q is zero on the others)."""
    target = random_target("qwen3", seed=11, vocab=6, hidden=32, layers=4, heads=2, kv_heads=1)
    with torch.no_grad():
        target.head.weight.mul_(6.0)
    folder = random_eagle3(tmp_path / "s", target_dict(target), [1, 2, 3], seed=12, scale=0.5,
                           draft_vocab=draft_vocab)
    drafter = Eagle3Drafter.from_pretrained(folder)
    target.capture(drafter.config.capture_layers(target.num_layers))
    pair = TorchPair(target, drafter, None, name="random-eagle3", family="qwen3")
    assert_follows_the_target(pair, GenerationSettings(max_new_tokens=3, temperature=0.8, block_size=3,
                                                       draft_cutoff=0.3))


def test_the_demo_target_with_an_eagle3_drafter_keeps_plain_decodings_tokens(tmp_path):
    cfg = json.loads((TARGET / "config.json").read_text())
    pair = load_pair(TARGET, random_eagle3(tmp_path / "e", cfg, [1, 3, 6], draft_vocab=500), device="cpu")
    assert pair.info["method"] == "eagle3" and pair.block_size == 8
    for text in CODE:
        ids = pair.tokenizer.encode_prompt(text, raw=True)
        plain = Generation(pair, ids, GenerationSettings(max_new_tokens=40), baseline=True).run()
        fast = Generation(pair, ids, GenerationSettings(max_new_tokens=40, draft_cutoff=0.0,
                                                        plain_fallback=False)).run()
        assert fast.tokens == plain.tokens and fast.stats.drafted > 0
        assert fast.stats.draft_vocab == 500 and plain.stats.draft_vocab is None    # its head's tokens, told


def test_auto_sends_an_eagle3_drafter_to_torch_on_a_gpu_and_to_llamacpp_on_a_cpu(tmp_path):
    """The torch engine runs SpecForge's layout; on a CPU llama.cpp decodes faster (docs/BENCHMARKS.md); a layout
    only llama.cpp reads (speculators' Eagle3Speculator) goes there on any device."""
    from engine.backends.choice import auto_engine
    cfg = json.loads((TARGET / "config.json").read_text())
    folder = random_eagle3(tmp_path / "e", cfg, [1, 3, 6])
    assert auto_engine(TARGET, "cuda", folder) == "torch" and auto_engine(TARGET, "cpu", folder) == "llamacpp"
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "architectures": ["Eagle3Speculator"]}))
    assert auto_engine(TARGET, "cuda", folder) == auto_engine(TARGET, "cpu", folder) == "llamacpp"
