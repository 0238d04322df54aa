"""Loading pairs on the MLX engine from folders: 4-bit (and 8-bit) quantized targets the way
mlx-community publishes them stay lossless against mlx-lm's own load and generate; the quantized-drafter
option; folders that ask for their own code, disagree with their weights or with mlx-lm's layout are
refused by name; and the CLI and the worker run the mlx engine end to end."""
import json

import pytest

mx = pytest.importorskip("mlx.core", reason="the mlx engine needs mlx (pip install 'dflash-desktop[mlx]')")

from engine.backends import load_pair  # noqa: E402
from engine.backends.mlx.drafter import save_drafter  # noqa: E402
from engine.backends.mlx.target import MlxTarget  # noqa: E402
from tests.tiny_mlx import VARIANTS, random_drafter, random_model, save_model, target_config  # noqa: E402
from engine.errors import CheckpointError, EngineError, PairMismatchError  # noqa: E402
from engine.limits import GenerationSettings  # noqa: E402
from engine.loop import Generation  # noqa: E402
from tests.oracle import OraclePair  # noqa: E402

PROMPT = [(7 * i) % 250 + 1 for i in range(40)]


def save_pair(root, arch="qwen3", bits=None, seed=3, **sizes):
    """A random target (quantized to `bits` when given) and drafter, written as MLX folders."""
    config = target_config(arch, **sizes)
    model = random_model(config, seed)
    save_model(model, config, root / "target", quantize_bits=bits)
    save_drafter(random_drafter(MlxTarget(model, config, mx.cpu), seed=seed + 1, block_size=8), root / "draft")
    return root / "target", root / "draft"


def mlx_lm_reference(folder, prompt, n):
    """mlx-lm's own load and greedy generate, independent of the engine."""
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model
    with mx.stream(mx.cpu):
        model, _ = load_model(folder)
        return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=n)]


@pytest.mark.parametrize("arch", VARIANTS)
def test_a_4bit_target_is_lossless_and_agrees_with_mlx_lm(tmp_path, arch):
    target, draft = save_pair(tmp_path, arch, bits=4)
    pair = load_pair("mlx", target, draft, device="cpu")
    assert pair.info["quantized"] == ["target"] and pair.info["dtype"] == "float32"
    ref = Generation(pair, PROMPT, GenerationSettings(max_new_tokens=30), baseline=True).run().tokens
    assert ref == mlx_lm_reference(target, PROMPT, 30)
    run = Generation(OraclePair(pair, ref + [0] * 8, wrong_every=4), PROMPT,
                     GenerationSettings(max_new_tokens=30, plain_fallback=False)).run()
    assert run.tokens == ref and 0 < run.stats.acceptance_rate < 1


def test_an_8bit_target_in_bfloat16(tmp_path):
    target, draft = save_pair(tmp_path, "qwen3_5", bits=8)
    pair = load_pair("mlx", target, draft, device="cpu", dtype="bfloat16")
    assert pair.info["dtype"] == "bfloat16"
    ref = Generation(pair, PROMPT, GenerationSettings(max_new_tokens=20), baseline=True).run().tokens
    run = Generation(pair, PROMPT, GenerationSettings(max_new_tokens=20, plain_fallback=False)).run()
    assert run.tokens == ref


@pytest.mark.parametrize("bits", [4, 8])
def test_a_quantized_drafter_only_changes_acceptance(tmp_path, monkeypatch, bits):
    target, draft = save_pair(tmp_path, "qwen3", hidden=128, heads=4)
    monkeypatch.setenv("DFLASH_MLX_DRAFT_BITS", str(bits))
    pair = load_pair("mlx", target, draft, device="cpu")
    assert pair.info["quantized"] == ["drafter"]
    assert pair.drafter.layers[0].mlp.down_proj.bits == bits
    ref = Generation(pair, PROMPT, GenerationSettings(max_new_tokens=20), baseline=True).run().tokens
    assert Generation(pair, PROMPT, GenerationSettings(max_new_tokens=20, plain_fallback=False)).run().tokens == ref


def test_a_bad_drafter_bits_setting_is_refused(tmp_path, monkeypatch):
    target, draft = save_pair(tmp_path)
    monkeypatch.setenv("DFLASH_MLX_DRAFT_BITS", "3")
    with pytest.raises(EngineError, match="DFLASH_MLX_DRAFT_BITS"):
        load_pair("mlx", target, draft, device="cpu")


def edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_a_folder_that_names_its_own_code_is_refused_and_the_code_never_runs(tmp_path):
    target, draft = save_pair(tmp_path)
    marker = tmp_path / "ran"
    (target / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    edit_config(target, model_file="evil.py")
    with pytest.raises(CheckpointError, match="never runs a model folder's code"):
        load_pair("mlx", target, draft, device="cpu")
    assert not marker.exists()


def test_architectures_the_engine_does_not_claim_are_refused(tmp_path):
    target, draft = save_pair(tmp_path)
    edit_config(target, model_type="gemma4_text")
    with pytest.raises(CheckpointError) as err:
        load_pair("mlx", target, draft, device="cpu")
    assert err.value.code == "unsupported_architecture" and "qwen3" in str(err.value)


def test_a_deltanet_layout_mlx_lm_cannot_build_is_refused(tmp_path):
    target, draft = save_pair(tmp_path, "qwen3_5")
    edit_config(target, layer_types=["linear_attention", "full_attention", "full_attention", "linear_attention",
                                     "linear_attention", "full_attention"])
    with pytest.raises(CheckpointError, match="layer_types") as err:
        load_pair("mlx", target, draft, device="cpu")
    assert err.value.code == "unsupported_architecture"


def test_a_transformers_5_layer_types_sets_mlx_lms_interval(tmp_path):
    """transformers 5 writes layer_types alone; mlx-lm would assume every fourth layer is full attention."""
    target, draft = save_pair(tmp_path, "qwen3_5")
    config = json.loads((target / "config.json").read_text())
    del config["full_attention_interval"]
    config["layer_types"] = ["linear_attention", "full_attention"] * 3
    (target / "config.json").write_text(json.dumps(config))
    pair = load_pair("mlx", target, draft, device="cpu")
    assert [layer.is_linear for layer in pair.target.layers] == [True, False] * 3


def test_a_catalog_variants_dtype_loads_the_folders_own_quantization(tmp_path):
    """The planner sends a variant's catalog dtype (q4, q8, bf16): the bits come from the folder's config."""
    target, draft = save_pair(tmp_path, "qwen3", bits=4)
    pair = load_pair("mlx", target, draft, device="cpu", dtype="q4")
    assert pair.info["quantized"] == ["target"] and pair.info["dtype"] == "float32"
    assert {m.bits for _, m in pair.target.model.named_modules() if hasattr(m, "bits")} == {4}
    assert load_pair("mlx", target, draft, device="cpu", dtype="bf16").info["dtype"] == "bfloat16"
    with pytest.raises(EngineError, match="Unknown dtype 'q5'") as err:
        load_pair("mlx", target, draft, device="cpu", dtype="q5")
    assert err.value.code == "bad_settings"


def test_a_dflash2_config_over_dflash_weights_is_refused_by_name_before_loading(tmp_path):
    """The MLX engine runs every generation (DRAFTER_GENERATIONS); a DFlash2 config whose weights lack
    DFlash2's layers names what is missing, never half-loads (a real DFlash2 drafter: tests/test_mlx_dflash2.py)."""
    from engine.backends import ENGINES
    assert ENGINES["mlx"].drafter_generations == (1, 2, 3, 4)
    target, draft = save_pair(tmp_path)
    raw = json.loads((draft / "config.json").read_text())
    raw["architectures"] = ["DFlash2DraftModel"]
    raw.setdefault("dflash_config", {}).update(conv_kernel_size=2, conv_group_size=16, selector_rank=4,
                                              selector_top_k=4)
    (draft / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"lack \d+ tensors \(first: candidate_selector"):
        load_pair("mlx", target, draft, device="cpu")


def test_config_and_weights_that_disagree_are_refused_before_loading(tmp_path):
    target, draft = save_pair(tmp_path, "qwen3", bits=4)
    edit_config(target, hidden_size=96)
    with pytest.raises(CheckpointError, match="hidden_size 96"):
        load_pair("mlx", target, draft, device="cpu")


def test_a_drafter_for_another_target_is_refused(tmp_path):
    target, _ = save_pair(tmp_path / "a", "qwen3")
    _, draft = save_pair(tmp_path / "b", "qwen3", hidden=128)
    with pytest.raises(PairMismatchError, match="hidden size"):
        load_pair("mlx", target, draft, device="cpu")


def test_a_drafter_missing_a_tensor_is_refused(tmp_path):
    target, draft = save_pair(tmp_path)
    weights = mx.load(str(draft / "model.safetensors"))
    del weights["layers.0.mlp.up_proj.weight"]
    mx.save_safetensors(str(draft / "model.safetensors"), weights)
    with pytest.raises(CheckpointError, match="lack 1 tensors"):
        load_pair("mlx", target, draft, device="cpu")


@pytest.mark.skipif(mx.metal.is_available(), reason="Metal is there")
def test_apples_gpu_is_refused_by_name_without_metal(tmp_path):
    target, draft = save_pair(tmp_path)
    with pytest.raises(EngineError) as err:
        load_pair("mlx", target, draft, device="gpu")
    assert err.value.code == "device_unavailable" and "CPU instead" in str(err.value)


def test_the_cli_generates_and_benches_the_demo_pair_on_mlx(tmp_path, capsys):
    """The demo pair is a Hugging Face folder, converted by mlx-lm at load time."""
    from engine.cli import main
    out = tmp_path / "gen.json"
    assert main(["generate", "--pair", "demo", "--engine", "mlx", "--device", "cpu", "--prompt", "import os\n",
                 "--raw", "--max-new-tokens", "12", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["mode"] == "dflash" and len(result["token_ids"]) == 12
    assert main(["generate", "--pair", "demo", "--engine", "mlx", "--device", "cpu", "--prompt", "import os\n",
                 "--raw", "--max-new-tokens", "12", "--baseline", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["token_ids"] == result["token_ids"]
    assert "mlx engine on cpu" in capsys.readouterr().err
    bench = tmp_path / "bench.json"
    assert main(["bench", "--engine", "mlx", "--pair", "demo", "--device", "cpu", "--limit", "1",
                 "--max-new-tokens", "16", "--json", str(bench)]) == 0
    summary = json.loads(bench.read_text())
    assert summary["engine"] == "mlx" and summary["all_identical"]


def test_the_worker_loads_and_runs_an_mlx_pair(tmp_path, monkeypatch):
    from dflash_desktop.worker_client import WorkerClient
    from tests.tiny_torch import save_random_pair
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    target, draft = save_random_pair(tmp_path / "pair", block_size=8)   # with a tokenizer
    local = load_pair("mlx", target, draft, device="cpu")
    ids = local.tokenizer.encode_prompt("Hello", raw=True)
    expected = Generation(local, ids, GenerationSettings(max_new_tokens=12)).run().tokens
    client = WorkerClient(on_event=lambda event: None)
    try:
        loaded = client.wait(client.load_pair(target, draft, engine="mlx", device="cpu"), 120)
        assert loaded["event"] == "loaded", loaded
        assert loaded["engine"] == "mlx" and loaded["device"] == "cpu" and loaded["architecture"] == "qwen3"
        done = client.wait(client.generate(prompt="Hello", raw=True, settings={"max_new_tokens": 12}), 60)
        assert done["event"] == "done" and done["token_ids"] == expected
        hardware = client.wait(client.hardware(), 60)
        assert hardware["engines"]["mlx"]["available"] and hardware["engines"]["mlx"]["devices"][0]["device"] == "cpu"
    finally:
        assert client.shutdown(20) == 0
