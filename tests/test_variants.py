"""Catalog variants (an engine's own target files, e.g. GGUF quantizations): validated like the rest of the
catalog, planned and sized by run_plan/fit, and downloaded file for file (against tests/hub_server.py)."""
import copy
import json

import pytest

from dflash_desktop.catalog import CONFIG_FILES, CatalogError, bundled_path, parse_catalog
from dflash_desktop.downloads import DownloadJob, find_cached
from dflash_desktop.fit import estimate_here
from dflash_desktop.run_plan import engines_for, plan_for
from tests.hub_server import hub, make_repo  # noqa: F401  (fixture)
from tests.test_fit import report_of

WAIT = 30


@pytest.fixture
def raw():
    return json.loads(bundled_path().read_text())


def pair_of(raw, pid):
    return next(p for p in raw["pairs"] if p["id"] == pid)


def test_the_bundled_variants_parse_and_name_real_files(raw):
    cat = parse_catalog(raw)
    v = cat.get("qwen3-4b").variant("llamacpp")
    assert v is not None and v.files[0].endswith(".gguf") and v.dtype in cat.dtype_bytes and v.bytes > 10**9
    assert cat.get("qwen3-4b").variant("torch") is None


@pytest.mark.parametrize("field, value, message", [
    ("repo_id", "../evil", "owner/name"),
    ("repo_id", "a/b/c", "owner/name"),
    ("files", ["../../etc/passwd"], "plain relative paths"),
    ("files", ["/abs.gguf"], "plain relative paths"),
    ("files", [], "plain relative paths"),
    ("bytes", 0, "positive integer"),
    ("revision", "../main", "unsafe 'revision'"),
])
def test_a_variant_with_an_unsafe_or_broken_field_is_refused(raw, field, value, message):
    bad = copy.deepcopy(raw)
    pair_of(bad, "qwen3-4b")["variants"]["llamacpp"][0]["target"][field] = value
    with pytest.raises(CatalogError, match=message):
        parse_catalog(bad)


def test_variants_of_unknown_or_unlisted_engines_are_skipped(raw):
    future = copy.deepcopy(raw)
    pair_of(future, "qwen3-4b")["variants"]["mlx-next"] = [{"id": "x", "dtype": "q4", "target": {}}]
    assert "mlx-next" not in parse_catalog(future).get("qwen3-4b").variants
    orphan = copy.deepcopy(raw)
    del pair_of(orphan, "qwen3-4b")["engines"]["llamacpp"]
    pair = parse_catalog(orphan).get("qwen3-4b")
    assert pair.variants == {} and pair.repos("llamacpp") == pair.repos()


def test_the_plan_and_the_fit_use_the_variants_dtype_and_bytes(raw):
    cat = parse_catalog(raw)
    pair = cat.get("qwen3-4b")
    cpu = report_of("cpu_only_i5")
    plan = plan_for(pair, cpu)
    assert (plan.engine, plan.device, plan.dtype) == ("llamacpp", "cpu", "q4_k_m") and plan.variant.id == "q4_k_m"
    fit = estimate_here(pair, cpu)
    assert fit.breakdown["target_weights"] == plan.variant.bytes and fit.kv_dtype == "fp16"
    assert [p.engine for p in engines_for(pair, cpu)] == ["llamacpp", "torch"]
    cpu.engines_missing = {"llamacpp": "not built"}
    assert plan_for(pair, cpu).engine == "torch", "an engine without its runtime here is passed over"
    assert plan_for(pair, report_of("nvidia_rtx4090_nvml")).engine == "torch"


def test_a_variant_downloads_exactly_its_files_and_the_targets_config(hub, tmp_path, monkeypatch, raw):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub.repos["org/gguf"] = make_repo(3, shards=1, extra={"m-Q4_K_M.gguf": b"GGUF" + b"4" * 5000,
                                                         "m-Q8_0.gguf": b"GGUF" + b"8" * 9000})
    hub.repos["org/target"] = make_repo(4)
    hub.repos["org/draft"] = make_repo(5, shards=1)
    repos = [("org/gguf", "main", ("m-Q4_K_M.gguf",)), ("org/target", "main", CONFIG_FILES), ("org/draft", "main")]
    j = DownloadJob(repos, cache_dir=tmp_path / "cache", endpoint=hub.url, token=False)
    assert j.start().wait(WAIT) and j.state == "done", j.error
    gguf, target = j.result["org/gguf"], j.result["org/target"]
    assert sorted(p.name for p in gguf.iterdir()) == ["m-Q4_K_M.gguf"]
    assert (target / "config.json").is_file() and not list(target.glob("*.safetensors"))
    assert list(j.result["org/draft"].glob("*.safetensors"))
    assert find_cached("org/gguf", cache_dir=tmp_path / "cache", files=("m-Q4_K_M.gguf",)) == gguf
    assert find_cached("org/gguf", cache_dir=tmp_path / "cache", files=("m-Q8_0.gguf",)) is None
    missing = DownloadJob([("org/gguf", "main", ("m-Q2_K.gguf",))], cache_dir=tmp_path / "cache",
                          endpoint=hub.url, token=False)
    assert missing.start().wait(WAIT) and missing.state == "failed"
    assert missing.error.kind == "file_not_found" and "m-Q2_K.gguf" in missing.error.message
