"""DFlash2 drafters in the torch engine: a checkpoint in the public format (written here by name, without
our loader) loads, saves back in the same names, decodes losslessly, and each new sublayer computes what
an independent reference computation in this file says it should."""
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from engine.backends.torch.draft2_runner import Draft2Runner
from engine.backends.torch.draft_runner import block_mask
from engine.backends.torch.drafter import DFlashDrafter
from engine.backends.torch.drafter2 import DFlash2Drafter, DynamicConv, lattice, shaped_logits, walk
from engine.backends.torch.eager import TorchPair
from engine.backends.torch.engine import load_pair
from engine.backends.torch.sampling import Candidates, verify
from tests.tiny_torch import draft_config_dict, random_drafter, random_target
from engine.config import DraftConfig
from engine.errors import CheckpointError
from engine.limits import GenerationSettings
from engine.loop import Generation
from tests.test_engine_sampling import assert_follows_the_target

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 4, 2, 16, 96
VOCAB, TARGET_LAYERS, LAYER_IDS = 48, 4, [0, 2]
KERNEL, GROUP, RANK, TOP_K, WINDOW = 2, 16, 16, 8, 12


# ---- a public DFlash2 checkpoint, written from the format's names alone ------------------------------

def public_config(layers: int = 2, **dflash) -> dict:
    """config.json as the published DFlash2 drafters write it: DFlash settings nested in dflash_config."""
    return {
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "hidden_act": "silu", "hidden_size": HIDDEN, "intermediate_size": INTER,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "num_hidden_layers": layers, "rms_norm_eps": 1e-6, "vocab_size": VOCAB, "num_target_layers": TARGET_LAYERS,
        "max_position_embeddings": 512, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "layer_types": ["sliding_attention"] * layers, "sliding_window": WINDOW, "use_sliding_window": True,
        "max_window_layers": layers, "is_causal": False, "tie_word_embeddings": False, "use_cache": False,
        "dtype": "bfloat16", "transformers_version": "5.15.0",
        "dflash_config": {"block_size": 16, "mask_token_id": VOCAB - 1, "target_layer_ids": LAYER_IDS,
                          "conv_kernel_size": KERNEL, "conv_group_size": GROUP, "selector_rank": RANK,
                          "selector_top_k": TOP_K, "output_multiplier": 0.5, "final_logit_softcapping": 20.0,
                          **dflash},
    }


def public_shapes(layers: int = 2) -> dict[str, tuple[int, ...]]:
    """Every tensor of a DFlash2 drafter, by its public name (the codebooks have no `.weight`)."""
    groups = HIDDEN // GROUP
    shapes = {"fc.weight": (HIDDEN, len(LAYER_IDS) * HIDDEN), "hidden_norm.weight": (HIDDEN,),
              "norm.weight": (HIDDEN,), "candidate_selector.hidden_projection.weight": (RANK, HIDDEN),
              "candidate_selector.predecessor_codebook": (VOCAB, RANK),
              "candidate_selector.successor_codebook": (VOCAB, RANK)}
    for i in range(layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": (HEAD_DIM,), p + "self_attn.k_norm.weight": (HEAD_DIM,),
            p + "mlp.gate_proj.weight": (INTER, HIDDEN), p + "mlp.up_proj.weight": (INTER, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, INTER)})
        for conv in ("attention_conv", "mlp_conv"):
            shapes[p + conv + ".base_kernel"] = (2, KERNEL, HIDDEN)
            shapes[p + conv + ".kernel_projection.weight"] = (2 * KERNEL * groups, HIDDEN)
    return shapes


def write_public_checkpoint(folder, seed: int = 0, layers: int = 2, drop: str | None = None, config=None):
    """Random bfloat16 weights of a realistic scale; returns the tensors written."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in public_shapes(layers).items():
        if len(shape) == 1:                       # norms
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("base_kernel"):        # near the identity: tap 0 about 1
            t = 0.3 * torch.randn(shape, generator=g)
            t[:, 0] += 1.0
        elif name.endswith("codebook"):           # strong enough that the selector overrules the top logit
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) * 0.5 / shape[1] ** 0.5
        tensors[name] = t.to(torch.bfloat16)
    if drop:
        del tensors[drop]
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config or public_config(layers)))
    return tensors


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dflash2") / "draft"
    return folder, write_public_checkpoint(folder)


@pytest.fixture(scope="module")
def target():
    return random_target("qwen3", seed=4, vocab=VOCAB, hidden=HIDDEN, layers=TARGET_LAYERS, max_positions=512)


def test_the_public_checkpoint_loads_every_tensor_by_name(checkpoint):
    folder, tensors = checkpoint
    drafter = DFlash2Drafter.from_pretrained(folder)
    cfg = drafter.config
    assert cfg.generation == 2 and cfg.block_size == 16 and cfg.causal == (False, False)
    assert (cfg.dflash2.conv_kernel_size, cfg.dflash2.conv_group_size, cfg.dflash2.selector_rank,
            cfg.dflash2.selector_top_k, cfg.dflash2.output_multiplier, cfg.dflash2.final_logit_softcapping) == \
        (KERNEL, GROUP, RANK, TOP_K, 0.5, 20.0)
    state = {k: v for k, v in drafter.state_dict().items() if not k.startswith("rotary.")}
    assert state.keys() == tensors.keys()
    for name, tensor in tensors.items():
        torch.testing.assert_close(state[name], tensor.float(), rtol=0, atol=0, msg=name)


def propose_with(drafter, target, settings, seed=0):
    """The module's own proposal for one block (no runner): hidden -> head -> selector path."""
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randn(1, 7, drafter.fc.in_features, generator=g)
    block = torch.full((1, 8), VOCAB - 1)
    block[0, 0] = 5
    mask = block_mask(15, 8, WINDOW, False)[None, None]
    with torch.no_grad():
        hidden = drafter(target.embed(block), torch.arange(7, 15)[None], ctx, torch.arange(7)[None],
                         masks={"sliding_attention": mask})[0, 1:]
        logits = shaped_logits(target.head(hidden), drafter.config.dflash2)
        unary, cand = logits.topk(TOP_K, dim=-1)
        sel = drafter.candidate_selector
        scores = lattice(unary, cand, 5, sel.hidden_projection(hidden), sel.predecessor_codebook,
                         sel.successor_codebook)
        path, rows = walk(scores, settings, torch.Generator().manual_seed(seed))
    return logits, scores, cand.gather(1, torch.tensor(path)[:, None])[:, 0], rows


def test_saving_writes_the_public_format_and_reloads_to_the_same_logits(checkpoint, target, tmp_path):
    folder, tensors = checkpoint
    drafter = DFlash2Drafter.from_pretrained(folder)
    drafter.save_pretrained(tmp_path / "again")
    saved = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert saved.keys() == tensors.keys()
    assert "candidate_selector.predecessor_codebook" in saved and all(t.dtype == torch.bfloat16 for t in saved.values())
    raw = json.loads((tmp_path / "again" / "config.json").read_text())
    original = public_config()
    assert raw["architectures"] == ["DFlash2DraftModel"] and raw["dflash_config"] == original["dflash_config"]
    assert raw["is_causal"] is False and raw["layer_types"] == original["layer_types"]
    again = DFlash2Drafter.from_pretrained(tmp_path / "again")
    for greedy in (True, False):
        settings = GenerationSettings(temperature=0.0 if greedy else 0.8)
        for a, b in zip(propose_with(drafter, target, settings), propose_with(again, target, settings)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_greedy_dflash2_equals_plain_decoding_for_block_sizes_4_to_16(tmp_path, arch):
    """Through load_pair, which reads the generation from config.json and picks the DFlash2 classes. The
    prompt is longer than the drafter's sliding window, and block 16 is wider than it, so both sides of
    the window are exercised."""
    torch.manual_seed(0)
    tgt = random_target(arch, seed=7, vocab=VOCAB, hidden=HIDDEN, layers=TARGET_LAYERS, max_positions=512)
    with torch.no_grad():
        tgt.head.weight.mul_(8.0)   # a sharper target, so some random drafts get accepted
    tgt.model.save_pretrained(tmp_path / "target")
    write_public_checkpoint(tmp_path / "draft", seed=3)
    pair = load_pair(tmp_path / "target", tmp_path / "draft", device="cpu", dtype="float32")
    assert isinstance(pair.runner, Draft2Runner) and pair.info["drafter_generation"] == 2
    prompt = torch.randint(1, VOCAB - 1, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = Generation(pair, prompt, GenerationSettings(max_new_tokens=40), baseline=True).run().tokens
    accepted = 0
    for block in range(4, 17):
        run = Generation(pair, prompt, GenerationSettings(max_new_tokens=40, block_size=block, draft_cutoff=0.0,
                                                          plain_fallback=False)).run()
        assert run.tokens == ref, f"{arch}: block size {block} diverged from plain decoding"
        assert run.stats.drafted == run.stats.steps * (block - 1)
        accepted += run.stats.accepted
    assert accepted > 0, "no draft was ever accepted: the partial-acceptance paths did not run"


def test_the_runner_computes_what_the_module_computes(checkpoint, target):
    """Step by step with a growing context, hidden states and the proposed path alike."""
    folder, _ = checkpoint
    drafter = DFlash2Drafter.from_pretrained(folder)
    runner = Draft2Runner(drafter, target.head.weight)
    g = torch.Generator().manual_seed(2)
    ctx = torch.empty(0, drafter.fc.in_features)
    for c, n in ((9, 8), (1, 16), (4, 3), (20, 16)):
        new = torch.randn(c, drafter.fc.in_features, generator=g)
        ctx = torch.cat([ctx, new])
        ids = torch.randint(0, VOCAB, (n,), generator=g)
        block = target.embed(ids)
        start = ctx.shape[0]
        mask = block_mask(start + n, n, WINDOW, False)[None, None]
        with torch.no_grad():
            expected = drafter(block[None], torch.arange(start, start + n)[None], ctx[None],
                               torch.arange(start)[None], masks={"sliding_attention": mask})[0]
            got = runner.hidden(block, new)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    runner.reset()
    settings = GenerationSettings()
    _, _, path, rows = propose_with(drafter, target, settings)
    block = torch.full((8,), VOCAB - 1)
    block[0] = 5
    ctx = torch.randn(7, drafter.fc.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        drafts, q, got_rows = runner.propose(target.embed(block), ctx, 5, settings, None)
    assert drafts.tolist() == path.tolist() and q is None
    torch.testing.assert_close(got_rows, rows, rtol=1e-4, atol=1e-5)


def test_input_embedding_scale_multiplies_the_block_embedding(target):
    """Read from the top level when dflash_config lacks it, as the reference does."""
    drafter = random_drafter(target, seed=2, generation=2, layers=1, block_size=8, input_embedding_scale=3.0)
    assert drafter.config.input_embedding_scale == 3.0
    pair = TorchPair(target, drafter, None)
    prompt, settings = list(range(1, 20)), GenerationSettings(draft_cutoff=0.0)
    with torch.inference_mode():
        first = pair.prefill(prompt, settings, drafting=True)
        ctx = pair.answer.context[0].clone()
        drafts = pair.draft(first, len(prompt), 8)
        block = torch.full((8,), drafter.config.mask_token_id)
        block[0] = first
        proposed = {}
        for scale in (1.0, 3.0):
            runner = Draft2Runner(drafter, target.head.weight, pair.runner.dtype)
            proposed[scale] = runner.propose(target.embed(block) * scale, ctx, first, settings, None)[0].tolist()
    assert drafts == proposed[3.0] != proposed[1.0]


# ---- each new sublayer against an independent computation --------------------------------------------

def reference_conv(x, base, taps, group):
    """The static taps as a depthwise torch conv1d (one group per channel); the dynamic per-group taps
    by plain loops. x [n, H], base [K, H], taps [n, K, H // group]."""
    n, hidden = x.shape
    kernel = base.shape[0]
    # conv1d correlates: weight[c, 0, j] meets x[t - (K-1) + j], so tap k is weight index K-1-k
    static = F.conv1d(F.pad(x.T[None], (kernel - 1, 0)), base.flip(0).T[:, None, :], groups=hidden)[0].T
    dynamic = torch.zeros(n, hidden)
    for t in range(n):
        for k in range(min(kernel, t + 1)):
            for c in range(hidden):
                dynamic[t, c] += taps[t, k, c // group] * x[t - k, c]
    return static + dynamic


@pytest.mark.parametrize("kernel, group, n", [(2, 16, 8), (3, 8, 5), (4, 32, 2)])
def test_the_convolution_matches_a_depthwise_conv1d_plus_grouped_dynamic_taps(kernel, group, n):
    torch.manual_seed(kernel)
    conv = DynamicConv(HIDDEN, kernel, group)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_(0, 0.2)
    x, y = torch.randn(n, HIDDEN), torch.randn(n, HIDDEN)
    groups = HIDDEN // group
    # the projection's output index is side * K * G + tap * G + group, read here element by element
    flat = x @ conv.kernel_projection.weight.detach().T
    taps = torch.tensor([[[[float(flat[t, side * kernel * groups + k * groups + gi]) for gi in range(groups)]
                           for k in range(kernel)] for side in range(2)] for t in range(n)])
    with torch.no_grad():
        before, kept = conv.prepare(x)
        after = conv.finish(y, kept)
    torch.testing.assert_close(before, reference_conv(x, conv.base_kernel[0], taps[:, 0], group), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(after, reference_conv(y, conv.base_kernel[1], taps[:, 1], group), rtol=1e-4, atol=1e-4)


def test_a_fresh_dflash2_drafter_computes_what_dflash_does(target):
    """New convolutions are the identity: with the same attention and MLP weights, the hidden states
    equal the DFlash (gen 1) drafter's, so the convolutions sit around the sublayers, not in the residual."""
    torch.manual_seed(3)
    raw = draft_config_dict(target, layers=2, kv_heads=1)
    old = DFlashDrafter(DraftConfig.from_dict(raw)).eval()
    raw.update(architectures=["DFlash2DraftModel"])
    raw["dflash_config"].update(conv_kernel_size=2, conv_group_size=16, selector_rank=4, selector_top_k=4)
    new = DFlash2Drafter(DraftConfig.from_dict(raw)).eval()
    new.load_state_dict(old.state_dict(), strict=False)
    block, ctx = target.embed(torch.randint(0, VOCAB, (1, 6))), torch.randn(1, 5, old.fc.in_features)
    with torch.no_grad():
        a = old(block, torch.arange(5, 11)[None], ctx, torch.arange(5)[None])
        b = new(block, torch.arange(5, 11)[None], ctx, torch.arange(5)[None])
    torch.testing.assert_close(a, b)


def test_the_selector_walk_matches_a_plain_loop():
    """Scores unary_t(b) + sum_r P[a, r] g_t[r] Q[b, r] summed term by term; greedy walks the argmax from
    the anchor; sampling's rows are softmax(scores / T) given the predecessor really drawn."""
    g = torch.Generator().manual_seed(5)
    rows, k, rank, vocab, anchor = 5, 4, 3, 20, 7
    unary = torch.randn(rows, k, generator=g)
    cand = torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(rows)])
    proj = torch.randn(rows, rank, generator=g)
    pred, succ = torch.randn(vocab, rank, generator=g), torch.randn(vocab, rank, generator=g)

    def score(t, a, b):
        return float(unary[t, b]) + sum(float(pred[a, r] * proj[t, r] * succ[cand[t, b], r]) for r in range(rank))

    scores = lattice(unary, cand, anchor, proj, pred, succ)
    path, prev_token, expected = [], anchor, []
    for t in range(rows):
        options = [score(t, prev_token, b) for b in range(k)]
        best = max(range(k), key=options.__getitem__)
        path.append(best)
        expected.append(torch.softmax(torch.tensor(options), 0))
        prev_token = int(cand[t, best])
    got, probs = walk(scores, GenerationSettings(), None)
    assert got == path
    torch.testing.assert_close(probs, torch.stack(expected), rtol=1e-5, atol=1e-6)
    assert path != [int(unary[t].argmax()) for t in range(rows)], "the codebooks should overrule the unary scores"

    sampled, sampled_rows = walk(scores, GenerationSettings(temperature=0.5), torch.Generator().manual_seed(1))
    prev_token = anchor
    for t in range(rows):
        options = torch.tensor([score(t, prev_token, b) for b in range(k)])
        torch.testing.assert_close(sampled_rows[t], torch.softmax(options / 0.5, 0), rtol=1e-5, atol=1e-6)
        prev_token = int(cand[t, sampled[t]])


def test_logit_multiplier_and_softcap():
    cfg = DraftConfig.from_dict({**public_config(), "dflash_config": {**public_config()["dflash_config"],
                                                                      "output_multiplier": 0.25,
                                                                      "final_logit_softcapping": 3.0}}).dflash2
    logits = torch.tensor([[-40.0, -1.0, 0.0, 2.0, 100.0]])
    expected = [3.0 * math.tanh(v * 0.25 / 3.0) for v in logits[0].tolist()]
    torch.testing.assert_close(shaped_logits(logits, cfg)[0], torch.tensor(expected))
    off = DraftConfig.from_dict({**public_config(), "dflash_config": {
        k: v for k, v in public_config()["dflash_config"].items()
        if k not in ("output_multiplier", "final_logit_softcapping")}}).dflash2
    assert off.output_multiplier == 1.0 and off.final_logit_softcapping is None
    torch.testing.assert_close(shaped_logits(logits, off), logits)


@pytest.mark.parametrize("window, causal", [(None, True), (4, True), (4, False), (3, False)])
def test_masks_follow_the_reference_rule(window, causal):
    """Query i of n sits at key end-n+i; a key is visible within the window (both sides unless causal)
    and, when causal, at or before the query."""
    end, n = 11, 6
    mask = block_mask(end, n, window, causal)
    for i in range(n):
        q = end - n + i
        for key in range(end):
            near = window is None or (q - key < window and (causal or key - q < window))
            visible = (not causal or key <= q) and near
            assert bool(mask[i, key]) == visible, (i, key)
    assert block_mask(end, n, None, False) is None


# ---- configs: the generation, the keys, the tensors ----------------------------------------------------

def test_is_causal_decides_for_every_layer_and_its_absence_means_sliding_layers(target):
    raw = draft_config_dict(target, layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    assert DraftConfig.from_dict(raw).causal == (True, False)
    assert DraftConfig.from_dict({**raw, "is_causal": False}).causal == (False, False)
    assert DraftConfig.from_dict({**raw, "is_causal": True}).causal == (True, True)


def test_settings_read_nested_first_then_from_the_top_level():
    raw = public_config()
    top = {**raw, **raw["dflash_config"]}
    del top["dflash_config"]
    assert DraftConfig.from_dict(top).dflash2 == DraftConfig.from_dict(raw).dflash2
    both = {**raw, "selector_top_k": 3}
    assert DraftConfig.from_dict(both).dflash2.selector_top_k == TOP_K


@pytest.mark.parametrize("change, words", [
    ({"architectures": ["DFlash3DraftModel"]},
     "This drafter is a DFlash3DraftModel.*DFlashDraftModel.*DFlash2DraftModel"),
    ({"dflash_config": {"tree_width": 4}}, "dflash_config.tree_width is not a DFlash2 setting"),
    ({"dflash_config": {"conv_group_size": 24}}, "conv_group_size 24 does not divide hidden_size 64"),
    ({"dflash_config": {"selector_top_k": 4096}}, "selector_top_k must be a whole number from 1 to 48"),
    ({"dflash_config": {"selector_rank": None}}, "without selector_rank"),
    ({"dflash_config": {"conv_kernel_size": "2"}}, "conv_kernel_size must be a whole number"),
    ({"dflash_config": {"output_multiplier": -1.0}}, "output_multiplier must be a number above 0"),
    ({"dflash_config": {"final_logit_softcapping": float("inf")}}, "final_logit_softcapping must be a number"),
    ({"dflash_config": {"target_layer_ids": None}}, "without dflash_config.target_layer_ids"),
    ({"is_causal": "no"}, "is_causal must be true or false"),
    ({"layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types holds 'chunked_attention'"),
    ({"hidden_act": "gelu"}, "hidden_act is 'gelu'"),
    ({"speculators_model_type": "dflash2", "architectures": ["DFlashDraftModel"]}, "vLLM's speculators library"),
])
def test_config_errors_name_the_key(tmp_path, change, words):
    raw, change = public_config(), dict(change)
    nested = change.pop("dflash_config", {})
    raw.update(change)
    raw["dflash_config"].update(nested)
    write_public_checkpoint(tmp_path / "draft", config=raw)
    with pytest.raises(CheckpointError, match=words) as err:
        DFlash2Drafter.from_pretrained(tmp_path / "draft")
    if "DFlash3" in words or "speculators" in words:
        assert err.value.code == "unsupported_architecture"


@pytest.mark.parametrize("missing", ["candidate_selector.successor_codebook", "layers.1.mlp_conv.base_kernel"])
def test_a_missing_tensor_is_named(tmp_path, missing):
    write_public_checkpoint(tmp_path / "draft", drop=missing)
    with pytest.raises(CheckpointError, match=f"lack 1 tensors \\(first: {missing}\\)"):
        DFlash2Drafter.from_pretrained(tmp_path / "draft")


def test_the_other_generations_loader_refuses_and_load_pair_picks_the_right_one(checkpoint, target, tmp_path):
    folder, _ = checkpoint
    with pytest.raises(CheckpointError, match="generation 2 drafter, which DFlashDrafter does not load"):
        DFlashDrafter.from_pretrained(folder)
    random_drafter(target, layers=1).save_pretrained(tmp_path / "gen1")
    with pytest.raises(CheckpointError, match="generation 1 drafter, which DFlash2Drafter does not load"):
        DFlash2Drafter.from_pretrained(tmp_path / "gen1")


# ---- sampling: exact with a proposal that is zero outside the candidates -------------------------------

def test_the_residual_rule_is_exact_with_a_proposal_zero_outside_its_candidates():
    """One draft drawn from q (two candidates of six tokens), verified against p: the committed token must
    follow p, including the tokens q never proposes."""
    from scipy.stats import chisquare
    p_logits = torch.log(torch.tensor([[0.05, 0.30, 0.10, 0.25, 0.20, 0.10], [1 / 6] * 6]))
    q = Candidates(torch.tensor([[1, 4]]), torch.tensor([[0.2, 0.8]]))
    settings = GenerationSettings(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    counts = [0] * 6
    n = 20000
    for _ in range(n):
        draft = q.ids[0, torch.multinomial(q.probs[0], 1, generator=gen)]
        accepted, own = verify(draft, q, p_logits, settings, gen)
        counts[int(draft[0]) if accepted else own] += 1
    p = torch.softmax(p_logits[0].double(), 0)
    assert chisquare(counts, (p / p.sum() * n).tolist()).pvalue > 0.001


@pytest.mark.parametrize("temperature, top_k, top_p, cutoff", [(1.0, 0, 1.0, 0.0), (0.7, 3, 0.9, 0.3)])
def test_dflash2_samples_follow_the_target_distribution(temperature, top_k, top_p, cutoff):
    """The selector proposes 4 of 6 tokens per slot, each conditioned on the draft before it; with a
    cutoff, how many drafts are verified depends on those distributions too."""
    vocab = 6
    tgt = random_target("qwen3", seed=11, vocab=vocab, hidden=32, layers=2, heads=2, kv_heads=1)
    with torch.no_grad():
        tgt.head.weight.mul_(6.0)
    drafter = random_drafter(tgt, seed=12, generation=2, layers=1, block_size=4, top_k=4, rank=4, group=8,
                             heads=2, kv_heads=1)
    pair = TorchPair(tgt, drafter, None, name="random-dflash2", family="qwen3")
    assert_follows_the_target(pair, GenerationSettings(max_new_tokens=3, temperature=temperature, top_k=top_k,
                                                       top_p=top_p, block_size=4, draft_cutoff=cutoff))


def test_a_dflash2_drafter_saved_by_vllms_speculators_is_refused_by_name_in_every_engine(tmp_path):
    """Its DFlash2 format is not read yet (its DFlash one is: tests/test_speculators.py): torch and MLX read
    DraftConfig, and llama.cpp's converter is never started on it."""
    from engine.backends.llamacpp import convert
    cfg = {"architectures": ["DFlashDraftModel"], "speculators_model_type": "dflash2", "block_size": 16,
           "aux_hidden_state_layer_ids": [2, 10, 18], "mask_token_id": 151669, "draft_vocab_size": 32000,
           "transformer_layer_config": {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 1}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for load in (lambda: DraftConfig.from_file(tmp_path / "config.json"), lambda: convert.draft_gguf(tmp_path, tmp_path)):
        with pytest.raises(CheckpointError, match="vLLM's speculators library") as err:
            load()
        assert err.value.code == "unsupported_architecture" and "DFlash2 format" in str(err.value)
