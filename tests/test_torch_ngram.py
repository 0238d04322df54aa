"""N-gram lookup in the torch engine (engine/lookup.py): greedy output is plain decoding's on the
demo pair (its target alone and with its drafter, eager and through the CUDA path's static steps on the CPU) and
on SmolLM2 (a real chat model), with drafts proposed and kept on prompts the answer repeats; sampled answers follow
the target's distribution; the plain fallback names it; what a pair cannot run is refused by name."""
import pytest
import torch

from engine.backends import ENGINES
from engine.backends.torch.cuda import CudaPair
from engine.backends.torch.eager import TorchPair
from engine.backends.torch.engine import load_pair
from engine.lookup import NGRAM_BLOCK, Lookup
from engine.bench import DEMO_DIR
from engine.errors import SettingsError
from engine.limits import GenerationSettings
from engine.loop import Generation, StepCosts
from tests.test_engine_sampling import VOCAB, assert_follows_the_target, sample_many
from tests.tiny_torch import random_pair, random_target

# code the demo target continues by repeating itself (a 5.8M model loops): n-gram lookup's best case
REPETITIVE = ("x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny = 2\nx = 1\n",
              "def test_add():\n    assert add(1, 2) == 3\n\n\ndef test_sub():\n    assert sub(3, 2) == 1\n\n\n"
              "def test_mul():\n")
NGRAM = GenerationSettings(max_new_tokens=96, method="ngram", plain_fallback=False)
PLAIN = GenerationSettings(max_new_tokens=96)


@pytest.fixture(scope="module")
def demo_target():
    return load_pair(DEMO_DIR / "target", device="cpu")


@pytest.fixture(scope="module")
def demo_pair():
    return load_pair(DEMO_DIR / "target", DEMO_DIR / "draft", device="cpu")


def assert_ngram_is_plain_decoding(pair, prompts, ngram=NGRAM, plain=PLAIN):
    """Greedy n-gram lookup gives plain decoding's tokens on every prompt, and drafts were proposed and kept."""
    proposed = accepted = 0
    for ids in prompts:
        reference = Generation(pair, ids, plain, baseline=True).run()
        fast = Generation(pair, ids, ngram).run()
        assert fast.tokens == reference.tokens
        assert fast.stats.block_size == pair.info["ngram_block"] and fast.fallback is None
        assert fast.stats.accepted <= fast.stats.drafted
        proposed, accepted = proposed + fast.stats.drafted, accepted + fast.stats.accepted
    assert proposed > 0 and accepted > 0, (proposed, accepted)
    return accepted / proposed


def assert_drafter_waits_during_ngram_lookup(pair):
    """n-gram lookup's drafts and blocks, not the drafter's, on the repetitive prompts; the default stays the
    drafter's."""
    prompts = [pair.tokenizer.encode_prompt(text, raw=True) for text in REPETITIVE]
    assert_ngram_is_plain_decoding(pair, prompts)
    dflash = Generation(pair, prompts[0], GenerationSettings(max_new_tokens=32, plain_fallback=False)).run()
    assert dflash.stats.block_size == 16 and dflash.stats.drafted > 0


def assert_ngram_is_plain_decoding_on_edits(pair):
    """A real chat model (SmolLM2) asked to repeat and edit text it was given, 64 tokens an answer."""
    prompts = [pair.tokenizer.encode_chat([{"role": "user", "content": text}]) for text in (
        "Repeat this list, one item per line: apples, bread, cheese, dates, eggs, flour, grapes, honey.",
        "Here is a function:\n\n```python\ndef area(width, height):\n    result = width * height\n    return result\n"
        "```\n\nRename `result` to `size` and show the whole function.")]
    assert_ngram_is_plain_decoding(pair, prompts, GenerationSettings(max_new_tokens=64, method="ngram",
                                                                      plain_fallback=False),
                                   GenerationSettings(max_new_tokens=64))


def test_lookup_proposes_what_followed_the_latest_occurrence_of_the_longest_match():
    lookup = Lookup([5, 2, 3, 4, 8, 1, 2, 3, 9, 7, 2, 3])
    assert lookup.propose(3) == [9, 7, 2]            # (2, 3) last came before 9; (7, 2, 3) never did
    lookup.extend([6, 1, 2, 3])
    assert lookup.propose(2) == [9, 7]               # (1, 2, 3), the longest, wins over the later (2, 3)
    assert Lookup([1, 2, 3]).propose(4) == []        # the last token never occurred before
    assert Lookup([7, 1, 2, 1, 2]).propose(5) == [1, 2, 1, 2, 1]   # a repeating phrase keeps its period


def test_the_torch_engine_runs_ngram_lookup_on_every_pair(demo_target, demo_pair):
    assert ENGINES["torch"].methods == ("none", "ngram", "eagle3", "dspark", "dflash", "dflash2")
    assert demo_target.info["methods"] == ["none", "ngram"] and demo_target.block_size == 1
    assert demo_pair.info["methods"] == ["none", "ngram", "dflash"] and demo_pair.block_size == 16
    assert demo_target.info["ngram_block"] == demo_pair.info["ngram_block"] == NGRAM_BLOCK


def test_greedy_ngram_lookup_is_plain_decoding_on_the_demo_target_alone(demo_target):
    prompts = [demo_target.tokenizer.encode_prompt(text, raw=True) for text in REPETITIVE]
    assert assert_ngram_is_plain_decoding(demo_target, prompts) > 0.5


def test_greedy_ngram_lookup_is_plain_decoding_beside_a_drafter(demo_pair):
    """The drafter stays idle: n-gram lookup's drafts and blocks, not DFlash's."""
    assert_drafter_waits_during_ngram_lookup(demo_pair)


@pytest.mark.parametrize("drafter", [False, True])
def test_greedy_ngram_lookup_is_plain_decoding_in_the_cuda_paths_static_steps(demo_target, demo_pair, drafter):
    """CudaPair on the CPU (no graphs): its verify pads n-gram drafts to a block of their own."""
    eager = demo_pair if drafter else demo_target
    static = CudaPair(eager.target, eager.drafter, eager.tokenizer, eager.name, "qwen3", context=400, graphs=False,
                      bucket=64)
    for text in REPETITIVE:
        ids = eager.tokenizer.encode_prompt(text, raw=True)
        fast = Generation(static, ids, NGRAM).run()
        assert fast.tokens == Generation(eager, ids, PLAIN, baseline=True).run().tokens
        assert fast.stats.accepted > 0
    assert f"{NGRAM_BLOCK}x128" in static.graph_status()


def test_greedy_ngram_lookup_is_plain_decoding_on_a_hybrid_in_the_static_steps():
    """A Qwen3.5 hybrid's DeltaNet state is rolled back by commit after n-gram blocks too (a random model: it
    drafts from the prompt's own repeats)."""
    eager = random_pair("qwen3_5", seed=3, vocab=64, hidden=64, layers=4, max_positions=512, head_scale=4.0)
    static = CudaPair(eager.target, None, None, "", "qwen3_5", context=300, graphs=False, bucket=64)
    prompt = [3, 9, 4, 1, 7] * 8
    settings = GenerationSettings(max_new_tokens=64, method="ngram", plain_fallback=False)
    plain = Generation(eager, prompt, GenerationSettings(max_new_tokens=64), baseline=True).run()
    for pair in (eager, static):
        fast = Generation(pair, prompt, settings).run()
        assert fast.tokens == plain.tokens and fast.stats.drafted > 0


def test_greedy_ngram_lookup_is_plain_decoding_on_smollm2(smollm2_folder):
    """A real chat model asked to repeat and edit text it was given."""
    pair = load_pair(smollm2_folder, device="cpu")
    assert pair.info["methods"] == ["none", "ngram"]
    assert_ngram_is_plain_decoding_on_edits(pair)


@pytest.fixture(scope="module")
def tiny_vocab_target():
    """As test_engine_sampling's pair, without a drafter: a 6-token vocabulary, where n-gram lookup finds a
    match nearly every step."""
    target = random_target("qwen3", seed=11, vocab=VOCAB, hidden=32, layers=2, heads=2, kv_heads=1)
    with torch.no_grad():
        target.head.weight.mul_(6.0)
    return TorchPair(target, None, None, "random-qwen3", "qwen3")


@pytest.mark.parametrize("temperature, top_k, top_p, penalty", [(1.0, 0, 1.0, 1.0), (0.7, 4, 0.9, 1.0),
                                                                (1.0, 0, 1.0, 1.8)])
def test_ngram_lookup_samples_follow_the_target_distribution(tiny_vocab_target, temperature, top_k, top_p, penalty):
    """Its drafts are certain (q is one at the draft): the residual rule keeps a draft x with probability p(x)
    and otherwise draws from p without x, which is exact. Drafts must be kept for this to mean anything: one
    draft per step is kept about one time in five here."""
    settings = GenerationSettings(max_new_tokens=3, temperature=temperature, top_k=top_k, top_p=top_p,
                                  repeat_penalty=penalty, method="ngram", plain_fallback=False, block_size=4)
    _, kept = sample_many(tiny_vocab_target, GenerationSettings(**{**settings.__dict__, "max_new_tokens": 12,
                                                                   "block_size": 2}), 100)
    assert kept > 0.1, f"drafts kept {kept:.2f}"
    assert_follows_the_target(tiny_vocab_target, settings)


def test_the_plain_fallback_names_ngram_lookup_and_keeps_the_tokens(demo_target):
    """Plain steps measured as nearly free: n-gram lookup can never keep pace, so the loop switches after its
    first steps and says which method it left."""
    from engine.bench import demo_prompts
    ids = demo_target.tokenizer.encode_prompt(demo_prompts(1)[0][1], raw=True)
    costs = StepCosts()
    costs.plain.append(1e-9)
    settings = GenerationSettings(max_new_tokens=160, method="ngram")
    run = Generation(demo_target, ids, settings, costs=costs).run()
    assert run.fallback is not None and run.fallback["reason"].startswith("n-gram lookup "), run.fallback
    assert run.tokens == Generation(demo_target, ids, settings, baseline=True).run().tokens


def test_what_a_pair_cannot_run_is_refused_by_name(demo_target):
    with pytest.raises(SettingsError, match="runs plain decoding, n-gram lookup, not DFlash"):
        Generation(demo_target, [1, 2], GenerationSettings(method="dflash"))
    with pytest.raises(SettingsError, match=f"exceeds n-gram lookup's block size {NGRAM_BLOCK}"):
        Generation(demo_target, [1, 2], GenerationSettings(method="ngram", block_size=NGRAM_BLOCK + 1))
    # a target alone speculates with n-gram lookup by default; "none" names plain decoding
    assert demo_target.info["method"] == "ngram"
    default = Generation(demo_target, [1, 2], GenerationSettings(max_new_tokens=8)).run()
    assert default.stats.block_size == NGRAM_BLOCK and default.method_label == "n-gram lookup"
    plain = Generation(demo_target, [1, 2], GenerationSettings(max_new_tokens=8, method="none")).run()
    assert plain.stats.block_size == 1 and plain.stats.drafted == 0 and plain.tokens == default.tokens
