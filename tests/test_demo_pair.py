"""The embedded demo pair as shipped in assets/: it loads offline, stays lossless, and its drafter
really accelerates (a check of the shipped weights, not a timing)."""
import json
from pathlib import Path

import pytest

from engine.bench import DEMO_DIR, demo_prompts
from engine.limits import GenerationSettings
from engine.loop import Generation
from engine.backends.torch.engine import load_pair


@pytest.fixture(scope="module")
def demo():
    return load_pair(DEMO_DIR / "target", DEMO_DIR / "draft")


def test_shipped_files_are_small_and_documented():
    total = sum(p.stat().st_size for p in Path(DEMO_DIR).rglob("*") if p.is_file())
    assert total <= 40 * 2**20, f"demo assets are {total / 2**20:.1f} MiB"
    recipe = json.loads((DEMO_DIR / "RECIPE.json").read_text())
    assert set(recipe["stages"]) >= {"tokenizer", "target", "drafter"}
    assert "PSF" in recipe["corpus"]["license"]
    assert not set(recipe["corpus"]["held_out_files"]) & set(recipe["corpus"].get("train_files", []))


def test_drafter_accepts_long_blocks_on_held_out_files(demo):
    """The first five held-out files in recipe order (a fixed set, never trained on), 128 tokens each,
    verifying whole blocks (no draft cutoff) so tau measures the drafter alone."""
    lengths = []
    for name, text in demo_prompts(limit=5):
        ids = demo.tokenizer.encode_prompt(text, raw=True)
        fast = Generation(demo, ids, GenerationSettings(max_new_tokens=128, draft_cutoff=0.0,
                                                                  plain_fallback=False)).run()
        plain = Generation(demo, ids, GenerationSettings(max_new_tokens=128), baseline=True).run()
        assert fast.tokens == plain.tokens, f"DFlash diverged from plain decoding on {name}"
        assert fast.stats.block_size == 16
        lengths += fast.stats.acceptance_lengths
    tau = sum(lengths) / len(lengths)
    assert tau > 3.0, f"mean acceptance length {tau:.2f} over the first five held-out files"


def test_demo_writes_python(demo):
    run = Generation(demo, demo.tokenizer.encode_prompt("import sys\n\n\ndef main(argv=None):", raw=True),
                     GenerationSettings(max_new_tokens=48)).run()
    assert run.text.startswith("\n    "), f"expected an indented function body, got {run.text[:40]!r}"
    assert any(word in run.text for word in ("return", "def ", "if ", " = ")), run.text
