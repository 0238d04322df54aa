"""N-gram lookup in the MLX engine (engine/lookup.py, shared with the torch engine), on MLX's CPU device, for
answers that name it (a target alone decodes plainly unless asked): greedy output is plain decoding's on the demo
target alone and beside its drafter and on SmolLM2 (a real chat model), with drafts proposed and kept; sampled
answers follow the target's own distribution (chi-square)."""
import pytest

mx = pytest.importorskip("mlx.core", reason="the mlx engine needs mlx (pip install 'dflash-desktop[mlx]')")

from engine.backends import ENGINES, load_pair  # noqa: E402
from engine.bench import DEMO_DIR  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.lookup import NGRAM_BLOCK  # noqa: E402
from engine.loop import Generation  # noqa: E402
from tests.test_mlx_sampling import assert_follows_the_target, tiny_vocab  # noqa: E402
from tests.test_torch_ngram import (REPETITIVE, assert_drafter_waits_during_ngram_lookup,  # noqa: E402
                                    assert_ngram_is_plain_decoding, assert_ngram_is_plain_decoding_on_edits)


@pytest.fixture(scope="module")
def demo_target():
    return load_pair("mlx", DEMO_DIR / "target", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def demo_pair():
    return load_pair("mlx", DEMO_DIR / "target", DEMO_DIR / "draft", device="cpu", dtype="float32")


def test_the_mlx_engine_runs_ngram_lookup_on_every_pair(demo_target, demo_pair):
    assert ENGINES["mlx"].methods == ("none", "ngram", "eagle3", "dspark", "dflash", "dflash2")
    assert (demo_target.info["methods"], demo_target.info["method"]) == (["none", "ngram"], "none")
    assert (demo_pair.info["methods"], demo_pair.info["method"]) == (["none", "ngram", "dflash"], "dflash")
    assert demo_target.info["ngram_block"] == demo_pair.info["ngram_block"] == NGRAM_BLOCK


def test_greedy_ngram_lookup_is_plain_decoding_on_the_demo_target_alone(demo_target):
    prompts = [demo_target.tokenizer.encode_prompt(text, raw=True) for text in REPETITIVE]
    assert assert_ngram_is_plain_decoding(demo_target, prompts) > 0.5


def test_greedy_ngram_lookup_is_plain_decoding_beside_a_drafter(demo_pair):
    """The drafter stays idle during n-gram lookup's answers, and drafts again in the next one."""
    assert_drafter_waits_during_ngram_lookup(demo_pair)


def test_greedy_ngram_lookup_is_plain_decoding_on_smollm2(smollm2_folder):
    """A real chat model asked to repeat and edit text it was given."""
    pair = load_pair("mlx", smollm2_folder, device="cpu", dtype="float32")
    assert pair.info["methods"] == ["none", "ngram"]
    assert_ngram_is_plain_decoding_on_edits(pair)


def test_ngram_samples_follow_the_target_distribution():
    """A certain proposal under the residual rule: a draft x is kept with probability p(x), else the token is drawn
    from p without x. On a 6-token vocabulary the answer's own tokens recur, so lookup drafts often."""
    pair = tiny_vocab("qwen3", 11)
    settings = GenerationSettings(max_new_tokens=3, temperature=1.0, method="ngram", plain_fallback=False)
    drafted = sum(Generation(pair, [1, 4, 2], GenerationSettings(**{**settings.__dict__, "seed": s})).run()
                  .stats.drafted for s in range(40))
    assert drafted > 0
    assert_follows_the_target(pair, settings)
