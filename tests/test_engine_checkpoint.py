"""Draft checkpoints in the z-lab format: round trip, accepted config variants, and clear errors."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import DraftConfig, default_target_layer_ids
from engine.limits import GenerationSettings
from engine.loop import Generation
from engine.backends.torch.drafter import DFlashDrafter
from engine.errors import CheckpointError, PairMismatchError
from engine.backends.torch.engine import load_pair
from tests.tiny_torch import draft_config_dict, random_drafter, random_target


def zlab_names(layers: int) -> set[str]:
    names = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(layers):
        p = f"layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
                  p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"}
        names |= {p + f"self_attn.{x}_proj.weight" for x in "qkvo"}
        names |= {p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
    return names


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target = random_target("qwen3", seed=5, vocab=128, hidden=64, layers=4)
    target.model.save_pretrained(root / "target")
    drafter = random_drafter(target, seed=6, layers=2, block_size=8)
    drafter.save_pretrained(root / "draft")
    return root, target, drafter


def drafter_logits(drafter, target):
    g = torch.Generator().manual_seed(0)
    ctx = torch.randn(1, 7, len(drafter.config.target_layer_ids) * 64, generator=g)
    block = torch.randint(0, 100, (1, 8), generator=g)
    with torch.no_grad():
        h = drafter(target.embed(block), torch.arange(7, 15)[None], ctx, torch.arange(7)[None])
        return target.logits(h)


def test_round_trip_keeps_logits_and_zlab_names(saved_pair):
    root, target, drafter = saved_pair
    names = set(load_file(str(root / "draft" / "model.safetensors")))
    assert names == zlab_names(2)
    cfg = json.loads((root / "draft" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dflash_config"]["block_size"] == 8
    again = DFlashDrafter.from_pretrained(root / "draft")
    # saved in bf16, so compare with the bf16-rounded original
    rounded = DFlashDrafter(drafter.config)
    rounded.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in drafter.state_dict().items()})
    torch.testing.assert_close(drafter_logits(again, target), drafter_logits(rounded.eval(), target))


def test_saved_pair_loads_and_stays_lossless(saved_pair):
    root, _, _ = saved_pair
    pair = load_pair(root / "target", root / "draft")
    prompt = [3, 9, 27, 81, 115]
    plain = Generation(pair, prompt, GenerationSettings(max_new_tokens=24), baseline=True).run()
    fast = Generation(pair, prompt, GenerationSettings(max_new_tokens=24)).run()
    assert fast.tokens == plain.tokens and fast.stats.block_size == 8


def test_config_variants_are_accepted(saved_pair):
    _, target, _ = saved_pair
    top = DraftConfig.from_dict(draft_config_dict(target, nested=False, block_size=10))
    assert top.block_size == 10
    raw = draft_config_dict(target, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    raw.pop("rope_theta")
    assert DFlashDrafter(DraftConfig.from_dict(raw)).rotary.inv_freq[1] < 0.5
    raw = draft_config_dict(target, rope_scaling={"rope_type": "linear", "factor": 2.0})
    DFlashDrafter(DraftConfig.from_dict(raw))
    raw = draft_config_dict(target, layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=4)
    cfg = DraftConfig.from_dict(raw)
    assert cfg.layer_types == ("sliding_attention", "full_attention") and cfg.sliding_window == 4


def test_default_layer_ids():
    assert default_target_layer_ids(36, 1) == [18]
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]


def test_missing_config_keys_are_named(tmp_path, saved_pair):
    _, target, _ = saved_pair
    raw = draft_config_dict(target)
    del raw["hidden_size"], raw["dflash_config"]["mask_token_id"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="hidden_size.*mask_token_id"):
        DFlashDrafter.from_pretrained(tmp_path)


def write_draft(tmp_path, target, **kwargs):
    drafter = DFlashDrafter(DraftConfig.from_dict(draft_config_dict(target, **kwargs)))
    drafter.save_pretrained(tmp_path / "draft")
    return tmp_path / "draft"


def test_hidden_size_mismatch(tmp_path, saved_pair):
    root, target, _ = saved_pair
    other = random_target("qwen3", vocab=128, hidden=32, layers=4)
    with pytest.raises(PairMismatchError, match="hidden size is 32 but the target's is 64"):
        load_pair(root / "target", write_draft(tmp_path, other, heads=2, kv_heads=1))


def test_layer_ids_beyond_depth(tmp_path, saved_pair):
    root, target, _ = saved_pair
    with pytest.raises(PairMismatchError, match=r"layers \[1, 9\].*only 4 layers"):
        load_pair(root / "target", write_draft(tmp_path, target, target_layer_ids=[1, 9], num_target_layers=None))


def test_mask_id_outside_vocabulary(tmp_path, saved_pair):
    root, target, _ = saved_pair
    with pytest.raises(PairMismatchError, match="mask token id 500"):
        load_pair(root / "target", write_draft(tmp_path, target, mask_token_id=500))


def test_truncated_weights(tmp_path, saved_pair):
    root, target, _ = saved_pair
    draft = write_draft(tmp_path, target)
    data = (draft / "model.safetensors").read_bytes()
    (draft / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt.*download it again"):
        load_pair(root / "target", draft)


def test_garbage_weights(tmp_path, saved_pair):
    root, target, _ = saved_pair
    draft = write_draft(tmp_path, target)
    (draft / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    with pytest.raises(CheckpointError, match="corrupt"):
        load_pair(root / "target", draft)


def test_weights_that_do_not_match_config(tmp_path, saved_pair):
    root, target, _ = saved_pair
    draft = write_draft(tmp_path, target)
    state = load_file(str(draft / "model.safetensors"))
    state["fc.weight"] = torch.zeros(3, 3, dtype=torch.bfloat16)
    save_file(state, str(draft / "model.safetensors"))
    with pytest.raises(CheckpointError, match="fc.weight.*do not belong together"):
        load_pair(root / "target", draft)


def test_directory_without_weights(tmp_path, saved_pair):
    root, target, _ = saved_pair
    draft = write_draft(tmp_path, target)
    (draft / "model.safetensors").unlink()
    (draft / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(CheckpointError, match="No \\*.safetensors.*pickled weights are never loaded"):
        load_pair(root / "target", draft)


def test_missing_folder_and_not_json(tmp_path, saved_pair):
    root, _, _ = saved_pair
    with pytest.raises(CheckpointError, match="No config.json"):
        load_pair(root / "target", tmp_path / "nowhere")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        DFlashDrafter.from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="No config.json in target folder"):
        load_pair(tmp_path / "empty", None)


def test_a_bfloat16_drafter_keeps_its_rotary_frequencies_in_float32(saved_pair):
    """Module.to(bfloat16) would round the rotary frequencies too: at position 4,000 the angles would be
    off by radians. The drafter loads its weights in bfloat16 and keeps the frequencies exact."""
    draft_dir = saved_pair[0] / "draft"
    exact = DFlashDrafter.from_pretrained(draft_dir, dtype=torch.float32)
    bf16 = DFlashDrafter.from_pretrained(draft_dir, dtype=torch.bfloat16)
    assert bf16.fc.weight.dtype == torch.bfloat16 and bf16.rotary.inv_freq.dtype == torch.float32
    assert torch.equal(bf16.rotary.inv_freq, exact.rotary.inv_freq)
    pos = torch.tensor([[4000]])
    cos, _ = bf16.rotary(torch.empty(1), pos)
    rounded = exact.rotary.inv_freq.to(torch.bfloat16).float()
    assert (cos[0, 0] - torch.cos(4000 * torch.cat([rounded, rounded]))).abs().max() > 0.1   # what rounding costs
