"""Targets quantized by bitsandbytes (engine/backends/torch/quantized.py), with the real library on this CPU:
int8 and NF4 while loading, a pre-quantized folder as it is, greedy DFlash identical to the quantized
target's own plain decoding, the drafter left in full precision, and the refusals (another quantization
method, bitsandbytes missing, Apple's GPU). On a GPU the same code runs bitsandbytes' CUDA kernels: its GPU
test never runs in CI (it passed on a lent H100: bench/gpu_checks.sh)."""
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.backends.torch import quantized
from engine.backends.torch.engine import load_pair
from tests.tiny_torch import save_random_pair
from engine.errors import CheckpointError, EngineError
from engine.limits import GenerationSettings
from engine.loop import Generation
from engine.weights import bytes_as, folder_tensors

pytest.importorskip("bitsandbytes")
pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    """A random pair whose LM head is sharpened, so greedy choices are not near-ties a kernel's rounding flips."""
    target, draft = save_random_pair(tmp_path_factory.mktemp("quantized"), block_size=8, hidden=128, layers=4)
    weights = load_file(target / "model.safetensors")
    weights["lm_head.weight"] = weights["lm_head.weight"] * 6
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    return target, draft


def run(pair, prompt, baseline=False, block=None):
    settings = GenerationSettings(max_new_tokens=24, block_size=block, draft_cutoff=0.0, plain_fallback=False)
    return Generation(pair, prompt, settings, baseline=baseline).run()


PROMPTS = [[5, 70, 71, 72, 9], list(range(30, 70)), [101] * 3]


@pytest.mark.parametrize("dtype,layer_class", [("int8", "Linear8bitLt"), ("nf4", "Linear4bit")])
def test_a_quantized_target_decodes_dflash_exactly_as_its_own_plain_decoding(pair_dirs, dtype, layer_class):
    full = load_pair(*pair_dirs, device="cpu")
    pair = load_pair(*pair_dirs, device="cpu", dtype=dtype)
    assert pair.info["dtype"] == dtype
    mlp = pair.target.model.model.layers[0].mlp.up_proj
    assert type(mlp).__name__ == layer_class
    assert pair.target.head.weight.dtype == torch.float32 and pair.drafter.fc.weight.dtype == torch.float32
    assert pair.target.model.get_memory_footprint() < full.target.model.get_memory_footprint() * 0.6
    for prompt in PROMPTS:
        plain = run(pair, prompt, baseline=True).tokens
        for block in (4, 8):
            assert run(pair, prompt, block=block).tokens == plain, (prompt, block)


def test_a_prequantized_folder_loads_quantized_without_being_asked(pair_dirs, tmp_path):
    quantized_pair = load_pair(*pair_dirs, device="cpu", dtype="nf4")
    folder = tmp_path / "nf4"
    quantized_pair.target.model.save_pretrained(folder)
    for name in pair_dirs[0].iterdir():
        if name.name.startswith(("tokenizer", "special_tokens")) or name.suffix == ".jinja":
            shutil.copy(name, folder / name.name)
    again = load_pair(folder, pair_dirs[1], device="cpu")
    assert again.info["dtype"] == "nf4"
    prompt = PROMPTS[1]
    assert run(again, prompt, block=8).tokens == run(quantized_pair, prompt, baseline=True).tokens


def test_other_quantization_methods_are_refused_by_name(pair_dirs, tmp_path):
    folder = tmp_path / "gptq"
    shutil.copytree(pair_dirs[0], folder)
    config = (folder / "config.json").read_text()
    (folder / "config.json").write_text(config.rstrip().rstrip("}") + ', "quantization_config": {"quant_method": "gptq", "bits": 4}}')
    with pytest.raises(CheckpointError, match="gptq"):
        load_pair(folder, pair_dirs[1], device="cpu")


def test_without_bitsandbytes_the_load_says_what_to_install(pair_dirs, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)     # import fails as if it were not installed
    with pytest.raises(EngineError, match=r'pip install "dflash-desktop\[nvidia\]"') as err:
        load_pair(*pair_dirs, device="cpu", dtype="nf4")
    assert err.value.code == "engine_unavailable"


def test_apples_gpu_is_refused_for_bitsandbytes():
    with pytest.raises(EngineError, match="Apple's GPU") as err:
        quantized.require(torch.device("mps"), "A target quantized to nf4")
    assert err.value.code == "bad_settings"


def test_the_memory_check_counts_quantized_layers_at_their_size(pair_dirs):
    tensors = folder_tensors(pair_dirs[0])
    layer_matrices = sum(t.numel for name, t in tensors.items() if ".layers." in name and len(t.shape) == 2)
    assert layer_matrices > 0
    full, nf4 = bytes_as(tensors, 4), bytes_as(tensors, 4, quantized.QUANTIZED["nf4"])
    assert full - nf4 == int(layer_matrices * (4 - 0.5625))


def test_the_worker_loads_a_quantized_target_over_the_protocol(pair_dirs, tmp_path, monkeypatch):
    from dflash_desktop.worker_client import WorkerClient     # here: bench/gpu_checks.sh runs this file without the app's packages
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))
    events = []
    client = WorkerClient(on_event=events.append)
    try:
        loaded = client.wait(client.load_pair(*pair_dirs, device="cpu", dtype="nf4"), 120)
        assert loaded["event"] == "loaded" and loaded["dtype"] == "nf4", loaded
        done = client.wait(client.generate(prompt_ids=PROMPTS[0], raw=True, settings={"max_new_tokens": 8}), 120)
        assert done["event"] == "done" and len(done["token_ids"]) == 8, done
    finally:
        assert client.shutdown(20) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (never in CI)")
@pytest.mark.parametrize("dtype", ["int8", "nf4"])
def test_on_a_gpu_a_quantized_target_takes_the_cuda_path_and_stays_exact(pair_dirs, dtype):
    from engine.backends.torch.cuda import CudaPair
    pair = load_pair(*pair_dirs, device="cuda", dtype=dtype)
    assert isinstance(pair, CudaPair) and pair.info["dtype"] == dtype
    assert pair.drafter.fc.weight.dtype == torch.bfloat16
    for prompt in PROMPTS:
        assert run(pair, prompt, block=8).tokens == run(pair, prompt, baseline=True).tokens
