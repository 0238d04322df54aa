"""Every architecture the torch engine claims (engine/backends/torch ARCHITECTURES) decodes losslessly:
greedy DFlash == greedy plain decoding == transformers' generate(), on tiny random stand-ins built with
transformers' own classes, with prompts longer than the sliding window, every block size, partial
acceptance (an oracle drafter with planted mistakes), and EOS and max tokens inside a block.
Runs on the CPU; the engine's CUDA and mps paths never run in this project's CI."""
import pytest
import torch

from engine.backends.torch import ARCHITECTURES
from tests.tiny_torch import VARIANTS, random_pair
from engine.limits import GenerationSettings
from engine.loop import Generation
from tests.oracle import OraclePair

WINDOW = 16          # the tiny models' sliding window; prompts are longer
PROMPT_LEN = 40


def test_every_claimed_architecture_has_a_stand_in_here():
    assert set(ARCHITECTURES) == set(VARIANTS.values())


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request):
    return random_pair(request.param, seed=3, vocab=256, hidden=64, layers=6, max_positions=512, window=WINDOW)


def prompt_of(n, seed=0, high=250):
    return torch.randint(1, high, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def settings(**kwargs):
    """Whole blocks verified and no plain fallback, so every run exercises the verify and rollback paths."""
    return GenerationSettings(**{"draft_cutoff": 0.0, "plain_fallback": False, **kwargs})


def plain(pair, prompt, n):
    return Generation(pair, prompt, GenerationSettings(max_new_tokens=n), baseline=True).run()


def hf_generate(pair, prompt, n):
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = pair.target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                         do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_greedy_dflash_equals_plain_decoding_and_generate_for_every_block_size(pair):
    prompt = prompt_of(PROMPT_LEN, seed=1)
    ref = plain(pair, prompt, 24).tokens
    assert ref == hf_generate(pair, prompt, 24)
    for block in range(2, 17):
        run = Generation(pair, prompt, settings(max_new_tokens=24, block_size=block)).run()
        assert run.tokens == ref, f"{pair.name}: block size {block} diverged from plain decoding"


def test_partial_acceptance_rolls_every_cache_back_exactly(pair):
    """The oracle proposes the target's own continuation with every third token wrong, so steps accept
    0..B-1 drafts and every layer kind must forget exactly the rejected positions."""
    prompt = prompt_of(PROMPT_LEN, seed=2)
    ref = plain(pair, prompt, 70).tokens
    for block, wrong in ((8, 3), (16, 7)):
        run = Generation(OraclePair(pair, ref, wrong_every=wrong), prompt,
                         settings(max_new_tokens=60, block_size=block)).run()
        assert run.tokens == ref[:60], f"{pair.name}: block {block} diverged after a partial acceptance"
        assert 0 < run.stats.acceptance_rate < 1
        assert len(set(run.stats.acceptance_lengths)) > 2, "acceptance lengths must vary"


def cache_tensors(cache) -> dict:
    """Every tensor a cache holds, by layer and kind (keys, values, convolution and recurrent state)."""
    out = {}
    for i, layer in enumerate(cache.layers):
        for kind in ("keys", "values"):
            t = getattr(layer, kind, None)
            if isinstance(t, torch.Tensor) and t.numel():
                out[(i, kind)] = t
        for kind in ("conv_states", "recurrent_states"):
            for j, t in (getattr(layer, kind, None) or {}).items():
                if t is not None:
                    out[(i, kind, j)] = t
    return out


@pytest.mark.parametrize("keep", [1, 4, 9])
def test_rollback_leaves_every_cache_as_a_fresh_run_on_the_kept_tokens_would(pair, keep):
    """Tiny random models barely depend on some states, so equal tokens alone could hide a state that
    was not rolled back: compare every cached tensor, and the next logits, with a fresh run."""
    target = pair.target
    prompt, block = prompt_of(PROMPT_LEN, seed=4), prompt_of(9, seed=5)
    with torch.inference_mode():
        target.reset()
        target.forward(torch.tensor([prompt]), features=False)
        target.rollback(PROMPT_LEN)
        target.forward(torch.tensor([block]), features=False)            # a verify of 9 tokens
        target.rollback(PROMPT_LEN + keep)
        rolled = {k: t.clone() for k, t in cache_tensors(target.cache).items()}
        after, _ = target.forward(torch.tensor([[7]]), features=False)
        target.reset()
        target.forward(torch.tensor([prompt + block[:keep]]), features=False)
        target.rollback(PROMPT_LEN + keep)
        fresh = {k: t.clone() for k, t in cache_tensors(target.cache).items()}
        expected, _ = target.forward(torch.tensor([[7]]), features=False)
    assert rolled.keys() == fresh.keys() and rolled
    for key, tensor in fresh.items():
        torch.testing.assert_close(rolled[key], tensor, rtol=1e-4, atol=1e-5, msg=lambda m: f"{pair.name}: {key}: {m}")
    torch.testing.assert_close(after, expected, rtol=1e-4, atol=1e-5)


def test_max_tokens_and_eos_inside_a_block(pair):
    prompt = prompt_of(PROMPT_LEN, seed=3)
    ref = plain(pair, prompt, 40).tokens
    for n in (1, 7, 11):
        run = Generation(OraclePair(pair, ref), prompt, settings(max_new_tokens=n, block_size=6)).run()
        assert run.tokens == ref[:n] and run.stop_reason == "length"
    stop_at = next(i for i in range(3, 30) if ref[i] not in ref[:i])
    pair.eos_ids = (ref[stop_at],)
    try:
        fast = Generation(OraclePair(pair, ref), prompt, settings(max_new_tokens=40, block_size=16)).run()
        again = plain(pair, prompt, 40)
    finally:
        pair.eos_ids = ()
    assert fast.tokens == again.tokens == ref[:stop_at]
    assert fast.stop_reason == again.stop_reason == "eos"


def multimodal_config(arch: str):
    """The config of a tiny multimodal checkpoint, the form Qwen3.5 and Gemma 4 ship in on the hub."""
    import transformers as tf

    from tests.tiny_torch import target_config
    text = target_config(arch, vocab=256, hidden=64, layers=6, max_positions=512, window=WINDOW).to_dict()
    if arch == "qwen3_5":
        vision = tf.Qwen3_5VisionConfig(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                                        patch_size=8, num_position_embeddings=64, spatial_merge_size=2,
                                        temporal_patch_size=2)
        return tf.Qwen3_5Config(text_config=text, vision_config=vision.to_dict(), image_token_id=250,
                                video_token_id=251, vision_start_token_id=252, vision_end_token_id=253)
    vision = tf.Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=2, head_dim=16, patch_size=8, position_embedding_size=64,
                                   pooling_kernel_size=2)
    return tf.Gemma4Config(text_config=text, vision_config=vision.to_dict(), audio_config=None, image_token_id=250,
                           boi_token_id=251, eoi_token_id=252, video_token_id=253, boa_token_id=254,
                           eoa_token_index=255, audio_token_id=249)


@pytest.mark.parametrize("arch", ["qwen3_5", "gemma4"])
def test_multimodal_checkpoints_load_as_their_text_decoder_and_stay_lossless(tmp_path, arch):
    from transformers import AutoModelForImageTextToText

    from engine.backends.torch.engine import load_pair
    from engine.backends.torch.target import TargetModel
    from tests.tiny_torch import random_drafter
    torch.manual_seed(0)
    full = AutoModelForImageTextToText.from_config(multimodal_config(arch)).eval()
    full.save_pretrained(tmp_path / "target")
    random_drafter(TargetModel(full), layers=1, block_size=8).save_pretrained(tmp_path / "draft")
    pair = load_pair(tmp_path / "target", tmp_path / "draft", device="cpu")
    assert pair.info["architecture"] == arch and pair.info["device"] == "cpu"
    prompt = prompt_of(PROMPT_LEN, seed=6, high=240)   # text only: no image or audio placeholder ids
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = full.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
                            pad_token_id=0)
    ref = out[0, PROMPT_LEN:].tolist()
    assert plain(pair, prompt, 20).tokens == ref
    assert Generation(pair, prompt, settings(max_new_tokens=20)).run().tokens == ref


def test_the_engines_page_lists_what_the_engines_claim():
    """docs/ENGINES.md's table, row by row, against the engines' own tables."""
    from pathlib import Path

    from engine.backends import ENGINES
    lines = (Path(__file__).parent.parent / "docs" / "ENGINES.md").read_text().splitlines()
    header = [h.strip() for h in next(line for line in lines if line.startswith("| target")).split("|")[1:-1]]
    documented = {}
    for line in (line for line in lines if line.startswith("| `")):
        cells = [c.strip() for c in line.split("|")[1:-1]]
        for column, cell in zip(header[2:], cells[2:]):
            engine, device = column.split(": ")
            if cell.startswith("yes"):
                documented.setdefault((engine, cells[0].strip("`")), set()).add(device.split(" ")[0])
    claimed = {(name, arch): set(devices) for name, info in ENGINES.items()
               for arch, devices in info.architectures.items()}
    assert documented == claimed
