"""DSpark drafters in the torch engine (and a speculators DSpark import in MLX too: tests/test_mlx_dspark.py holds
the rest of MLX's): a checkpoint in DeepSpec's layout (the demo's DFlash drafter with a Markov
head, tests/tiny_torch.py dspark_from) loads by name, its Markov head chains each draft on the one before, the
packed runner computes what the module does, greedy output is plain decoding's in both block layouts (from the
anchor slot, or after it as DFlash), a head that adds nothing after the anchor drafts exactly what the DFlash
drafter beneath it drafts, and sampling follows the target's distribution (chi-square)."""
import json

import pytest
import torch
from safetensors.torch import load_file

from engine.backends import load_pair as any_engine
from engine.backends.torch.dspark import DSparkDrafter, DSparkRunner, markov_drafts, module_drafts
from engine.backends.torch.eager import TorchPair
from engine.backends.torch.engine import load_pair
from engine.bench import DEMO_DIR
from engine.config import DraftConfig
from engine.errors import CheckpointError
from engine.limits import GenerationSettings
from engine.loop import Generation
from tests.test_engine_sampling import assert_follows_the_target
from tests.tiny_torch import assert_greedy_at_every_width, dspark_from, lockstep, random_drafter, random_target

TARGET, DRAFT = DEMO_DIR / "target", DEMO_DIR / "draft"
CODE = ["def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n", "import os\nimport sys\n\n\ndef main():\n"]


def test_a_deepspec_checkpoint_loads_by_name_and_says_where_its_drafts_start(tmp_path):
    folder = dspark_from(DRAFT, tmp_path / "dspark", rank=12)
    drafter = DSparkDrafter.from_pretrained(folder)
    cfg = drafter.config
    assert (cfg.generation, cfg.dspark.markov_rank, cfg.dspark.sample_from_anchor) == (3, 12, True)
    assert (cfg.first_draft, cfg.verify_width, cfg.input_width(5)) == (0, 17, 4)   # 16 drafts from 16 slots
    saved = load_file(folder / "model.safetensors")
    torch.testing.assert_close(drafter.markov_head.markov_w1.weight, saved["markov_head.markov_w1.weight"])
    assert not any(k.startswith("confidence_head") for k in drafter.state_dict())   # carried, not read
    after = DraftConfig.from_file(dspark_from(DRAFT, tmp_path / "after", sample_from_anchor=False) / "config.json")
    assert (after.first_draft, after.verify_width, after.input_width(5)) == (1, 16, 5)
    raw = json.loads((folder / "config.json").read_text())      # target layers numbered as speculators number them:
    assert not DraftConfig.from_dict({**raw, "aux_hidden_state_layer_ids": [2, 3, 4]}).dspark.sample_from_anchor
    # copies of the target's embedding and head beside the layers (llama.cpp's converter drops them too) load
    from safetensors.torch import save_file
    target = load_file(TARGET / "model.safetensors")["model.embed_tokens.weight"]
    save_file({"embed_tokens.weight": target, "lm_head.weight": target.clone()}, folder / "copies.safetensors")
    assert DSparkDrafter.from_pretrained(folder).config.generation == 3


def test_the_markov_head_chains_each_draft_on_the_one_before():
    """w1 sends token t to direction t mod r, w2 favours token v in direction v - 1 mod r: with flat logits the
    chain from anchor 3 is 4, 5, 6, ...; sampled at a temperature where the bias dominates, the same."""
    vocab, rank = 40, 8
    w1 = torch.eye(rank)[torch.arange(vocab) % rank]
    w2 = 30.0 * torch.eye(rank)[(torch.arange(vocab) - 1) % rank]
    w2[rank:] = 0.0                                     # only tokens 0..7 are favoured: the chain stays below 8
    logits = torch.zeros(6, vocab)
    drafts, q, biased = markov_drafts(logits, 3, w1, lambda x: x @ w2.T, GenerationSettings(), None)
    assert drafts.tolist() == [4, 5, 6, 7, 0, 1] and q is None
    assert biased[0, 4] == 30.0 and biased[0, 5] == 0.0
    sampled, q, _ = markov_drafts(logits, 3, w1, lambda x: x @ w2.T, GenerationSettings(temperature=1.0),
                                  torch.Generator().manual_seed(0))
    assert sampled.tolist() == [4, 5, 6, 7, 0, 1] and q.shape == (6, vocab)
    torch.testing.assert_close(q.sum(-1), torch.ones(6))
    assert markov_drafts(logits, 3, torch.zeros(vocab, rank), lambda x: x @ w2.T, GenerationSettings(),
                         None)[0].tolist() == [0] * 6                  # no bias: each slot's own argmax


@pytest.mark.parametrize("anchor", [True, False])
def test_the_runner_computes_what_the_module_computes(anchor):
    target = random_target("qwen3", seed=3, vocab=64, hidden=64, layers=4, heads=4, kv_heads=2)
    drafter = random_drafter(target, seed=4, generation=3, layers=2, block_size=8, sample_from_anchor=anchor)
    runner = DSparkRunner(drafter, target.head.weight)
    g = torch.Generator().manual_seed(1)
    ctx = torch.randn(9, drafter.fc.in_features, generator=g)
    block = torch.full((6,), drafter.config.mask_token_id)
    block[0] = 5
    with torch.no_grad():
        hidden = drafter(target.embed(block)[None], torch.arange(9, 15)[None], ctx[None], torch.arange(9)[None])[0]
        rows = hidden[drafter.config.first_draft:]
        for settings in (GenerationSettings(), GenerationSettings(temperature=0.9, top_k=20)):
            want = module_drafts(drafter, rows, target.head.weight, 5, settings, torch.Generator().manual_seed(2))
            runner.reset()
            got = runner.propose(target.embed(block), ctx, 5, settings, torch.Generator().manual_seed(2))
            assert got[0].tolist() == want[0].tolist() and len(got[0]) == 6 - drafter.config.first_draft
            torch.testing.assert_close(got[2], want[2], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("anchor", [True, False])
def test_greedy_dspark_equals_plain_decoding_at_every_width(anchor):
    torch.manual_seed(0)
    target = random_target("qwen3", seed=7, vocab=48, hidden=64, layers=4, max_positions=512)
    with torch.no_grad():
        target.head.weight.mul_(8.0)      # a sharper target, so some random drafts get accepted
    drafter = random_drafter(target, seed=8, generation=3, layers=2, block_size=8, sample_from_anchor=anchor)
    pair = TorchPair(target, drafter, None, name="random-dspark", family="qwen3")
    assert pair.block_size == (9 if anchor else 8) and pair.info["methods"] == ["none", "ngram", "dspark"]
    prompt = torch.randint(1, 47, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    assert_greedy_at_every_width(pair, prompt, "dspark")


def test_a_head_that_adds_nothing_after_the_anchor_drafts_what_its_dflash_base_drafts(tmp_path):
    """The demo's DFlash drafter, and the same as a DSpark one drafting after the anchor with a zero Markov head:
    the same drafts step for step, so both keep the same tokens; DeepSpec's layout on the same layers drafts
    other tokens (from the anchor slot, untrained here) and still gives plain decoding's output."""
    dflash = load_pair(TARGET, DRAFT, device="cpu")
    same = load_pair(TARGET, dspark_from(DRAFT, tmp_path / "zero", scale=0.0, sample_from_anchor=False), device="cpu")
    anchor = load_pair(TARGET, dspark_from(DRAFT, tmp_path / "anchor"), device="cpu")
    assert same.info["method"] == anchor.info["method"] == "dspark"
    greedy = GenerationSettings(max_new_tokens=40, draft_cutoff=0.0, draft_vocab=0)
    assert sum(map(len, lockstep((dflash, same), dflash.tokenizer.encode_prompt(CODE[0], raw=True), greedy))) > 0
    for text in CODE:
        ids = dflash.tokenizer.encode_prompt(text, raw=True)
        plain = Generation(dflash, ids, GenerationSettings(max_new_tokens=40), baseline=True).run()
        runs = [Generation(pair, ids, GenerationSettings(max_new_tokens=40, block_size=8, draft_cutoff=0.0,
                                                         plain_fallback=False)).run()
                for pair in (dflash, same, anchor)]
        assert all(run.tokens == plain.tokens for run in runs)
        assert runs[0].stats.position_accepts == runs[1].stats.position_accepts and runs[0].stats.accepted > 0
        assert runs[1].stats.accepted != runs[2].stats.accepted or runs[1].stats.position_accepts != \
            runs[2].stats.position_accepts


def test_dspark_samples_follow_the_target_distribution():
    """Each slot's draft is drawn from its logits biased by the draft before it; the residual rule then keeps
    the target's distribution, with a cutoff too (it reads those distributions, never the draws). DeepSpec's
    layout here; speculators' in tests/test_mlx_dspark.py (the chain is the same code, the first slot differs)."""
    anchor, temperature, top_k, cutoff = True, 0.8, 0, 0.3
    target = random_target("qwen3", seed=11, vocab=6, hidden=32, layers=2, heads=2, kv_heads=1)
    with torch.no_grad():
        target.head.weight.mul_(6.0)
    drafter = random_drafter(target, seed=12, generation=3, layers=1, block_size=3, rank=4, heads=2, kv_heads=1,
                             sample_from_anchor=anchor)
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.mul_(20.0)     # a bias that matters
    pair = TorchPair(target, drafter, None, name="random-dspark", family="qwen3")
    assert_follows_the_target(pair, GenerationSettings(max_new_tokens=3, temperature=temperature, top_k=top_k,
                                                       block_size=4 if anchor else 3, draft_cutoff=cutoff))


@pytest.mark.parametrize("change, words", [
    ({"markov_head_type": "gated"}, "markov_head_type 'gated'"),
    ({"draft_vocab_size": 100}, "only the llama.cpp engine"),
    ({"markov_rank": None}, "without markov_rank"),
    ({"markov_rank": 0}, "markov_rank must be a whole number"),
    ({"sample_from_anchor": "yes"}, "sample_from_anchor must be true or false"),
    ({"dflash_config": {"markov_head_type": "gated"}}, "markov_head_type 'gated'"),    # read nested first
])
def test_config_errors_name_the_key(tmp_path, change, words):
    raw = json.loads((dspark_from(DRAFT, tmp_path / "d") / "config.json").read_text())
    raw.update({k: v for k, v in change.items() if k != "dflash_config"})
    raw["dflash_config"].update(change.get("dflash_config", {}))
    with pytest.raises(CheckpointError, match=words):
        DraftConfig.from_dict({k: v for k, v in raw.items() if v is not None}, "config.json")


def test_a_missing_markov_tensor_is_named_and_a_saved_drafter_reloads_as_dspark(tmp_path):
    folder = dspark_from(DRAFT, tmp_path / "d")
    drafter = DSparkDrafter.from_pretrained(folder)
    drafter.save_pretrained(tmp_path / "again", dtype=torch.float32)
    again = DSparkDrafter.from_pretrained(tmp_path / "again")
    assert again.config.dspark == drafter.config.dspark
    torch.testing.assert_close(again.markov_head.markov_w2.weight, drafter.markov_head.markov_w2.weight)
    from safetensors.torch import save_file
    weights = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in weights.items() if k != "markov_head.markov_w2.weight"}, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="markov_head.markov_w2.weight"):
        DSparkDrafter.from_pretrained(folder)


# ---- a DSpark drafter saved by vLLM's speculators library: imported once, drafting from its trained tokens -----

def speculators_dspark(folder, scale: float, rank: int = 16):
    """The demo drafter as speculators saves a DSpark one (tests/test_speculators.py's DFlash layout, the kept
    tokens' head rows and d2t) with a Markov head whose markov_w2 has a row per kept token."""
    from safetensors.torch import save_file
    from tests.test_speculators import KEPT, speculators_config, write_speculators
    raw = speculators_config(speculators_model_type="dspark", architectures=["DSparkSpeculator"], markov_rank=rank)
    raw.pop("sample_from_anchor")                  # speculators' layout: after the anchor unless it says otherwise
    folder = write_speculators(folder, raw)
    g = torch.Generator().manual_seed(5)
    save_file({"markov_head.markov_w1.weight": torch.randn(4096, rank, generator=g) * scale,
               "markov_head.markov_w2.weight": torch.randn(KEPT, rank, generator=g) * scale},
              folder / "model-markov.safetensors")
    return folder


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_speculators_dspark_drafter_imports_with_its_markov_rows_spread_over_the_vocabulary(tmp_path, home):
    from engine import draft_vocab, speculators
    from tests.test_speculators import subset
    folder = speculators_dspark(tmp_path / "Demo.dspark", scale=0.1)
    out = speculators.imported(folder)
    cfg = DraftConfig.from_file(out / "config.json")
    assert (cfg.generation, cfg.first_draft, cfg.verify_width, cfg.dspark.markov_rank) == (3, 1, 16, 16)
    assert cfg.target_layer_ids == DraftConfig.from_file(DRAFT / "config.json").target_layer_ids
    spread = load_file(out / "markov.safetensors")["markov_head.markov_w2.weight"]
    rows = load_file(folder / "model-markov.safetensors")["markov_head.markov_w2.weight"]
    ids = torch.tensor(subset())
    assert spread.shape == (4096, 16) and torch.equal(spread[ids], rows)
    others = torch.ones(4096, dtype=torch.bool)
    others[ids] = False
    assert not spread[others].any()
    assert draft_vocab.load(out, 4096).trained and speculators.imported(folder, engine="llamacpp") == folder


@pytest.mark.parametrize("engine", ["torch", "mlx"])
def test_a_speculators_dspark_drafter_drafts_from_its_tokens_and_without_a_bias_as_its_dflash_twin(tmp_path, home,
                                                                                                  engine):
    """Greedy, in torch and MLX (its CPU device): plain decoding's tokens, every draft among the trained tokens; a
    zero Markov head drafts step for step what the same drafter saved as a speculators DFlash one drafts."""
    if engine == "mlx":
        pytest.importorskip("mlx.core", reason="the mlx engine needs mlx")
    from tests.test_speculators import KEPT, subset, write_speculators
    twin = any_engine(engine, TARGET, write_speculators(tmp_path / "Demo.dflash"), device="cpu")
    flat = any_engine(engine, TARGET, speculators_dspark(tmp_path / "flat.dspark", scale=0.0), device="cpu")
    biased = any_engine(engine, TARGET, speculators_dspark(tmp_path / "biased.dspark", scale=0.3), device="cpu")
    assert flat.info["method"] == "dspark" and flat.info["draft_vocab"] == KEPT
    kept, drafted = set(subset()), []
    draft = biased.draft
    biased.draft = lambda *a: drafted.extend(out := draft(*a)) or out
    settings = GenerationSettings(max_new_tokens=40, block_size=8, draft_cutoff=0.0, plain_fallback=False)
    for text in CODE:
        ids = twin.tokenizer.encode_prompt(text, raw=True)
        plain = Generation(twin, ids, GenerationSettings(max_new_tokens=40), baseline=True).run()
        runs = [Generation(pair, ids, settings).run() for pair in (twin, flat, biased)]
        assert all(run.tokens == plain.tokens for run in runs)
        assert runs[0].stats.position_accepts == runs[1].stats.position_accepts and runs[0].stats.accepted > 0
        assert {run.stats.draft_vocab for run in runs} == {KEPT}
    assert drafted and set(drafted) <= kept


@pytest.mark.parametrize("engine", ["torch", "mlx"])
def test_the_spread_markov_rows_bias_the_tokens_they_belong_to(tmp_path, home, engine):
    """markov_w2's row for the kept token k made to dominate (markov_w1's rows all ones): every draft is token k
    itself, in torch and MLX, so the import put each row at its token's place and the engines read them there."""
    if engine == "mlx":
        pytest.importorskip("mlx.core", reason="the mlx engine needs mlx")
    from safetensors.torch import save_file
    from tests.test_speculators import KEPT, subset
    folder = speculators_dspark(tmp_path / "Demo.dspark", scale=0.0)
    w2 = torch.zeros(KEPT, 16)
    w2[700] = 50.0
    save_file({"markov_head.markov_w1.weight": torch.ones(4096, 16), "markov_head.markov_w2.weight": w2},
              folder / "model-markov.safetensors")
    pair = any_engine(engine, TARGET, folder, device="cpu")
    run = Generation(pair, pair.tokenizer.encode_prompt(CODE[0], raw=True),
                     GenerationSettings(max_new_tokens=16, block_size=6, draft_cutoff=0.0, plain_fallback=False))
    drafted = []
    draft = pair.draft
    pair.draft = lambda *a: drafted.extend(out := draft(*a)) or out
    run.run()
    assert drafted and set(drafted) == {subset()[700]}


def test_a_speculators_dspark_drafter_engines_cannot_run_is_refused_before_anything_is_written(tmp_path, home):
    from engine import speculators
    from tests.test_speculators import speculators_config, write_speculators
    raw = speculators_config(speculators_model_type="dspark", architectures=["DSparkSpeculator"], markov_rank=16,
                             markov_head_type="gated")
    with pytest.raises(CheckpointError, match="markov_head_type 'gated'"):
        speculators.imported(write_speculators(tmp_path / "bad.dspark", raw))
    assert not (home / "cache" / "drafters").exists() or not list((home / "cache" / "drafters").iterdir())
