"""The model picker on recorded hardware: catalog rows with fit badges, the demo pair first and
loadable, clear reasons when a pair cannot run, and a real download from the local fake hub."""
from __future__ import annotations

import copy
import json
import socket
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from dflash_desktop.catalog import bundled_path, load_file, parse_catalog
from dflash_desktop.hardware import HardwareProbe, detect
from dflash_desktop.pairs import PairRequest, measured_key
from tests.hub_server import hub, make_repo  # noqa: F401  (fixture)
from tests.ui_fixtures import random_pair  # noqa: F401  (fixture)
from ui.model_picker import ModelPicker, hub_reachable
from ui.pair_list_model import PairListModel, Roles, build_rows

FIXTURES = Path(__file__).parent / "fixtures" / "hardware"
WAIT_MS = 30_000


def rtx3060():
    """12 GB card: the demo fits, Qwen3 4B is tight, Qwen3.5 4B runs target-only, Qwen3 8B won't fit."""
    return detect(HardwareProbe.from_dict(json.loads((FIXTURES / "nvidia_rtx3060_smi.json").read_text())))


def catalog_data(random_pair) -> dict:
    data = json.loads(bundled_path().read_text())
    pairs = {p["id"]: p for p in data["pairs"]}
    pairs["demo"]["target"]["path"], pairs["demo"]["drafter"]["path"] = map(str, random_pair)
    pairs["qwen3-4b"]["target"]["repo_id"] = "org/target"
    pairs["qwen3-4b"]["drafter"]["repo_id"] = "org/draft"
    pairs["qwen3-4b"]["variants"].pop("llamacpp")     # llama.cpp converts the target's own weights
    data["pairs"] = [pairs[k] for k in ("qwen3-4b", "qwen3-8b", "demo", "qwen3.5-4b")]  # demo not first on purpose
    return data


@pytest.fixture
def catalog(random_pair):
    """The bundled catalog with the demo pair pointing at a random pair and Qwen3 4B at the fake hub; its
    pairs in full precision only (no bitsandbytes variants), so the won't-fit and target-only paths show."""
    data = catalog_data(random_pair)
    for pair in data["pairs"]:
        pair.get("variants", {}).pop("torch", None)
    return parse_catalog(copy.deepcopy(data), "test")


@pytest.fixture
def picker(qtbot, catalog, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    dialog = ModelPicker(catalog=catalog, hardware=rtx3060())
    qtbot.addWidget(dialog)
    with qtbot.waitSignal(dialog.ready, timeout=WAIT_MS):
        pass
    return dialog


def rows(p: ModelPicker) -> dict[str, int]:
    return {p.model.index(i).data(Roles.Id): i for i in range(p.model.rowCount())}


def select(p: ModelPicker, pair_id: str):
    p.list.setCurrentIndex(p.model.index(rows(p)[pair_id]))
    return p.list.currentIndex()


def test_rows_badges_and_demo_first(picker):
    assert list(rows(picker)) == ["demo", "qwen3-4b", "qwen3-8b", "qwen3.5-4b"]
    verdicts = {pid: picker.model.index(i).data(Roles.Verdict) for pid, i in rows(picker).items()}
    assert verdicts == {"demo": "fits", "qwen3-4b": "tight", "qwen3-8b": "wont_fit", "qwen3.5-4b": "target_only"}
    demo = picker.model.index(0)
    assert demo.data(Roles.DownloadText) == "Built in · ready" and demo.data(Roles.CanLoad)
    q4 = picker.model.index(rows(picker)["qwen3-4b"])
    assert q4.data(Roles.DownloadState) == "not_downloaded" and q4.data(Roles.Reason) == "Download it first."
    assert "GB" in q4.data(Roles.SizeText) and q4.data(Roles.License) == "apache-2.0/mit"
    assert q4.data(Roles.ChatMode) == "non-thinking"
    assert "Total with DFlash" in q4.data(Qt.ItemDataRole.ToolTipRole) and "free VRAM" in q4.data(Roles.FitDetails)
    assert "RTX 3060" in picker.hardware_label.text()


def test_demo_pair_loads_and_emits_its_folders(qtbot, picker, random_pair):
    assert picker.list.currentIndex().row() == 0  # preselected
    assert picker.load_button.isEnabled()
    with qtbot.waitSignal(picker.pairChosen, timeout=WAIT_MS) as chosen:
        picker.load_button.click()
    assert chosen.args[0] == PairRequest("demo", "Demo pair (built in)", str(random_pair[0]), str(random_pair[1]),
                                         plan={"engine": "torch", "device": "cuda", "dtype": "bfloat16"},
                                         planned={"engine": "torch", "device": "cuda", "dtype": "bfloat16"})
    assert "Runs with PyTorch on the NVIDIA GPU (CUDA), bfloat16" in picker.facts.text()


def test_wont_fit_pair_cannot_be_loaded_or_downloaded_and_says_why(picker):
    idx = select(picker, "qwen3-8b")
    assert not picker.load_button.isEnabled() and not picker.download_button.isEnabled()
    assert not idx.data(Roles.CanLoad)
    assert "won't fit" in picker.reason.text() and "won't fit" in picker.fit_sentence.text()
    assert "Won't fit" in picker.badge.text()


def test_a_gpu_too_small_for_full_precision_plans_bitsandbytes_quantization(qtbot, random_pair, tmp_path,
                                                                            monkeypatch):
    """With the catalog's bitsandbytes variants, the 12 GB card runs Qwen3 8B and Qwen3.5 4B with DFlash on
    quantized weights, says so, and sends that dtype to the worker; what fits in full precision stays so."""
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    dialog = ModelPicker(catalog=parse_catalog(catalog_data(random_pair), "test"), hardware=rtx3060())
    qtbot.addWidget(dialog)
    with qtbot.waitSignal(dialog.ready, timeout=WAIT_MS):
        pass
    plans = {pid: dialog.model.index(i).data(Roles.Plan) for pid, i in rows(dialog).items()}
    verdicts = {pid: dialog.model.index(i).data(Roles.Verdict) for pid, i in rows(dialog).items()}
    assert plans["demo"]["dtype"] == plans["qwen3-4b"]["dtype"] == "bfloat16"
    assert plans["qwen3-8b"] == {"engine": "torch", "device": "cuda", "dtype": "nf4"}
    assert plans["qwen3.5-4b"] == {"engine": "torch", "device": "cuda", "dtype": "int8"}   # 8-bit first
    assert verdicts["qwen3-8b"] in ("fits", "tight") and verdicts["qwen3.5-4b"] in ("fits", "tight")
    select(dialog, "qwen3-8b")
    assert "NF4 4-bit (bitsandbytes)" in dialog.facts.text()
    assert "quantized to NF4 4-bit (bitsandbytes) while loading" in dialog.fit_sentence.text()


def test_offline_mode_is_shown_and_disables_downloads(picker):
    select(picker, "qwen3-4b")  # conftest runs tests with HF_HUB_OFFLINE=1
    assert "Offline" in picker.offline_label.text()
    assert not picker.download_button.isEnabled()


def test_a_hub_out_of_reach_turns_download_off_and_a_failure_is_said_once(qtbot, picker, monkeypatch):
    """A hub nobody answers at: the red dot, and Download off (saying why) instead of a click that fails; a
    failed download's reason is shown once, under the facts, which only say that it failed."""
    import socket

    from huggingface_hub import constants
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", dead)
    select(picker, "qwen3-4b")
    picker._refresh_offline()
    qtbot.waitUntil(lambda: "Can't reach" in picker.offline_label.text(), timeout=WAIT_MS)
    assert not picker.download_button.isEnabled() and "cannot be reached" in picker.download_button.toolTip()
    picker.model.set_download("qwen3-4b", "error", error="The hub at x cannot be reached, and org/target is not here.")
    select(picker, "qwen3-4b")
    assert "Download failed (why, below)" in picker.facts.text() and "org/target" not in picker.facts.text()
    assert picker.reason.text() == "The hub at x cannot be reached, and org/target is not here."


def test_download_from_the_fake_hub_shows_progress_then_loads(qtbot, picker, hub, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.repos["org/target"] = make_repo(1, shards=2, shard_size=400_000)
    hub.repos["org/draft"] = make_repo(2, shards=1, shard_size=400_000)
    hub.slow_bps = 4_000_000  # about 0.3 s in all: progress is visible on the way
    idx = select(picker, "qwen3-4b")
    picker._refresh_offline()
    qtbot.waitUntil(lambda: "Online (127.0.0.1" in picker.offline_label.text(), timeout=WAIT_MS)
    assert picker.download_button.isEnabled() and not picker.load_button.isEnabled()
    fractions = []
    picker.model.dataChanged.connect(lambda *_: fractions.append(idx.data(Roles.DownloadFraction)))
    picker.download_button.click()
    assert idx.data(Roles.DownloadState) == "downloading" and picker.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: idx.data(Roles.DownloadState) != "downloading", timeout=WAIT_MS)
    assert idx.data(Roles.DownloadState) == "ready", idx.data(Roles.DownloadText)
    assert any(0 < f < 1 for f in fractions), fractions
    assert picker.load_button.isEnabled()
    with qtbot.waitSignal(picker.pairChosen, timeout=WAIT_MS) as chosen:
        picker.load_button.click()
    got = chosen.args[0]
    assert got.id == "qwen3-4b"
    assert (Path(got.target_dir) / "config.json").read_bytes() == hub.repos["org/target"].files["config.json"]
    assert (Path(got.draft_dir) / "config.json").read_bytes() == hub.repos["org/draft"].files["config.json"]


def test_pair_no_engine_runs_on_this_device_says_where_it_runs():
    cpu = detect(HardwareProbe.from_dict(json.loads((FIXTURES / "cpu_only_i5.json").read_text())))
    cpu.engines_missing = {"llamacpp": "not built"}     # its GGUF is the CPU's way: without llama.cpp, none
    model = PairListModel()
    model.set_rows(build_rows(load_file(bundled_path()), cpu, {}))
    idx = next(model.index(r) for r in range(model.rowCount()) if model.index(r).data(Roles.Id) == "qwen3.5-27b")
    assert idx.data(Roles.Verdict) == "unsupported" and not idx.data(Roles.CanLoad)
    assert idx.data(Roles.Reason) == ("Qwen3.5 27B would run here with llama.cpp, which this copy of the app lacks: "
                                      "not built")


def test_the_size_shown_is_what_the_plan_downloads():
    """On a CPU, Qwen3 4B is planned as its GGUF Q4_K_M for llama.cpp: the list shows that file's size (plus the
    drafter), not the bfloat16 checkpoint's; where the plan runs the target's own weights, those."""
    from ui.pair_list_model import pair_size
    cpu = detect(HardwareProbe.from_dict(json.loads((FIXTURES / "cpu_only_i5.json").read_text())))
    catalog = load_file(bundled_path())
    rows = {r.pair.id: r for r in build_rows(catalog, cpu, {})}
    qwen = rows["qwen3-4b"]
    variant = qwen.fit.plan.files_variant
    assert qwen.fit.plan.engine == "llamacpp" and variant is not None and variant.dtype == "q4_k_m"
    assert qwen.size_bytes == pair_size(qwen.pair, catalog, variant) < pair_size(qwen.pair, catalog)
    assert qwen.size_bytes - variant.bytes == pair_size(qwen.pair, catalog) - qwen.pair.target.params * 2
    cpu.engines_missing = {"llamacpp": "not built"}   # torch then runs the checkpoint: that is what downloads
    plain = {r.pair.id: r for r in build_rows(catalog, cpu, {})}["qwen3.5-4b"]
    assert plain.fit.plan.engine == "torch" and plain.size_bytes == pair_size(plain.pair, catalog)


def test_target_only_pair_loads_without_its_drafter(catalog, random_pair):
    local = {"qwen3.5-4b": {"target": Path("/t"), "drafter": Path("/d")}}
    model = PairListModel()
    model.set_rows(build_rows(catalog, rtx3060(), local))
    i = next(r for r in range(model.rowCount()) if model.index(r).data(Roles.Id) == "qwen3.5-4b")
    assert model.index(i).data(Roles.CanLoad) and model.index(i).data(Roles.DraftDir) is None
    assert model.index(i).data(Roles.TargetDir) == "/t"


def test_pair_list_model_passes_qt_model_tester(qtmodeltester, catalog):
    model = PairListModel()
    model.set_rows(build_rows(catalog, rtx3060(), {}))
    qtmodeltester.check(model)
    model.set_download("qwen3-4b", "downloading", 0.5, "Downloading 50%")
    qtmodeltester.check(model)


def test_hub_reachability_is_checked_not_assumed(hub):
    assert hub_reachable(hub.url)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert not hub_reachable(f"http://127.0.0.1:{port}", timeout=2)


def test_cancel_download_returns_to_not_downloaded(qtbot, picker, hub, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.repos["org/target"] = make_repo(1, shards=2, shard_size=2_000_000)
    hub.repos["org/draft"] = make_repo(2, shards=1, shard_size=400_000)
    hub.slow_bps = 500_000  # several seconds: time to cancel mid-file
    idx = select(picker, "qwen3-4b")
    picker.download_button.click()
    qtbot.waitUntil(lambda: 0 < idx.data(Roles.DownloadFraction) < 1, timeout=WAIT_MS)
    assert not picker.cancel_button.isHidden() and picker.download_button.isHidden()
    picker.cancel_button.click()
    qtbot.waitUntil(lambda: idx.data(Roles.DownloadState) == "not_downloaded", timeout=WAIT_MS)
    assert picker.download_button.isEnabled() and not picker.load_button.isEnabled()


def test_gated_pair_asks_for_a_token_without_showing_it(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_DESKTOP_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    dialog = ModelPicker(catalog=load_file(bundled_path()), hardware=rtx3060())
    qtbot.addWidget(dialog)
    with qtbot.waitSignal(dialog.ready, timeout=WAIT_MS):
        pass
    select(dialog, "llama3.1-8b-instruct")
    assert not dialog.token_box.isHidden()
    assert "huggingface.co/meta-llama/Llama-3.1-8B-Instruct" in dialog.token_help.text()
    assert dialog.token_edit.echoMode() == dialog.token_edit.EchoMode.Password
    select(dialog, "qwen3-4b")
    assert dialog.token_box.isHidden()


def test_the_search_box_filters_the_list_by_every_word(qtbot, picker):
    ids = list(rows(picker))
    qtbot.keyClicks(picker.search, "qwen3 8b")
    shown = [pid for pid, i in rows(picker).items() if not picker.list.isRowHidden(i)]
    assert shown == ["qwen3-8b"] and picker.list.currentIndex().data(Roles.Id) == "qwen3-8b"
    assert picker.title.text() == picker.list.currentIndex().data(Roles.Name)   # the details follow
    picker.search.clear()
    assert all(not picker.list.isRowHidden(i) for i in rows(picker).values()) and len(ids) == 4
    qtbot.keyClicks(picker.search, "no such model")
    assert all(picker.list.isRowHidden(i) for i in rows(picker).values())


def test_two_drafters_of_one_kind_are_two_choices(qtbot, picker, monkeypatch, tmp_path):
    """Qwen3 8B has z-lab's DFlash drafter and RedHatAI's (vLLM speculators' format): the box names both by
    publisher, and choosing the second changes the row's drafter, and back; with both on disk, what loading
    one measured fastest is shown for it alone (each drafter calibrates on its own files)."""
    from dflash_desktop import downloads
    monkeypatch.setattr(downloads, "find_cached", lambda repo, revision=None: tmp_path / repo)
    picker.measured = {measured_key("qwen3-8b", str(tmp_path / "z-lab/Qwen3-8B-DFlash-b16")):
                       {"method": "dflash", "summary": "DFlash, 3 drafts a step. z-lab's.", "engine": "llamacpp"}}
    idx = select(picker, "qwen3-8b")
    items = [picker.method_box.itemText(i) for i in range(picker.method_box.count())]
    assert items[0].startswith("DFlash drafter (z-lab) · 2.1 GB more")
    assert items[1].startswith("DFlash drafter (RedHatAI) · 3.5 GB more")
    picker.method_box.activated.emit(1)
    idx = select(picker, "qwen3-8b")
    red = "dflash:RedHatAI/Qwen3-8B-speculator.dflash"
    assert picker.method_box.currentData() == red
    assert picker.model.pair_row(idx.row()).pair.drafter.repo_id == "RedHatAI/Qwen3-8B-speculator.dflash"
    assert picker.measured_label.isHidden() and picker.measured_label.text() == ""
    assert f"Runs with {idx.data(Roles.PlanLabel)}\n" in picker.facts.text()     # the other drafter: not measured
    picker.method_box.activated.emit(0)
    idx = select(picker, "qwen3-8b")
    assert picker.model.pair_row(idx.row()).pair.drafter.repo_id == "z-lab/Qwen3-8B-DFlash-b16"
    assert picker.measured_label.text().endswith("DFlash, 3 drafts a step. z-lab's.")
    assert not picker.measured_label.isHidden()
    planned = idx.data(Roles.PlanLabel)          # a first load here timed llama.cpp faster than the plan
    assert f"Runs with llama.cpp: measured faster here than {planned}\n" in picker.facts.text()


def test_choosing_a_speculation_changes_what_downloads_and_loads(qtbot, picker, hub, monkeypatch):
    """Qwen3 4B offers its DFlash, EAGLE-3 and DSpark drafters and n-gram lookup: the speculation box lists
    each with what it adds to the download and the engines that run it; choosing EAGLE-3 plans PyTorch on this
    computer's NVIDIA GPU (it runs SpecForge's layout; before, only llama.cpp on the CPU did); choosing n-gram lookup shows the target's size alone, downloads only the target from the fake hub, and
    loads without a drafter."""
    from huggingface_hub import constants
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.repos["org/target"] = make_repo(1, shards=1, shard_size=200_000)   # org/draft is not served at all
    idx = select(picker, "qwen3-4b")
    assert not picker.method_row.isHidden()
    items = [picker.method_box.itemText(i) for i in range(picker.method_box.count())]
    assert [picker.method_box.itemData(i) for i in range(len(items))] == ["dflash", "eagle3", "dspark", "ngram"]
    tips = [picker.method_box.itemData(i, Qt.ToolTipRole) for i in range(len(items))]
    assert items[0] == "DFlash drafter (org) · 1.1 GB more" and "PyTorch" in tips[0]
    assert items[1] == "EAGLE-3 drafter (AngelSlim) · 440 MB more" and tips[1] == "Runs in MLX, llama.cpp or PyTorch."
    assert items[3] == "n-gram lookup · nothing more to download" and tips[3] == "Runs in MLX, llama.cpp or PyTorch."
    with_drafter = idx.data(Roles.SizeBytes)
    picker.method_box.activated.emit(1)
    idx = select(picker, "qwen3-4b")
    assert idx.data(Roles.Plan)["engine"] == "torch" and "PyTorch on the NVIDIA GPU (CUDA)" in picker.facts.text()
    assert picker.method_box.currentData() == "eagle3" and "Drafter block size 7" in picker.facts.text()
    picker.method_box.activated.emit(3)
    idx = select(picker, "qwen3-4b")
    assert picker.method_box.currentData() == "ngram" and idx.data(Roles.Plan)["engine"] == "torch"
    assert idx.data(Roles.SizeBytes) < with_drafter and "Drafter block size" not in picker.facts.text()
    assert "with n-gram lookup" in picker.fit_sentence.text()
    picker._refresh_offline()
    qtbot.waitUntil(lambda: "Online (127.0.0.1" in picker.offline_label.text(), timeout=WAIT_MS)
    picker.download_button.click()
    qtbot.waitUntil(lambda: idx.data(Roles.DownloadState) != "downloading", timeout=WAIT_MS)
    assert idx.data(Roles.DownloadState) == "ready", idx.data(Roles.DownloadText)
    with qtbot.waitSignal(picker.pairChosen, timeout=WAIT_MS) as chosen:
        picker.load_button.click()
    got = chosen.args[0]
    assert got.draft_dir is None and got.plan["engine"] == "torch"
    assert (Path(got.target_dir) / "config.json").read_bytes() == hub.repos["org/target"].files["config.json"]
