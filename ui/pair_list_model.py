"""The catalog pairs as a Qt list model: one row per pair, every fact the picker shows in a named role.

The demo pair is always the first row. Facts that take disk or hardware work (fit estimate, which
files are already downloaded) are computed by the caller, off the GUI thread, and handed in with
`set_rows`; live download progress comes in through `set_download`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt

from dflash_desktop import variant_folder
from dflash_desktop.catalog import Catalog, Pair
from dflash_desktop.fit import SLOW_TOK_S, FitEstimate, estimate_here
from dflash_desktop.hardware import HardwareReport, gib
from engine.backends import DEVICE_CLASSES, DEVICE_LABELS, ENGINES, METHODS

VERDICT_LABELS = {"fits": "Fits", "slow": "Fits, slowly", "tight": "Tight fit", "target_only": "Target only",
                  "wont_fit": "Won't fit", "unsupported": "Not for this device", "unknown": "Checking…"}
TERM_LABELS = {"target_weights": "Target weights", "drafter_weights": "Drafter weights",
               "kv_cache": "Target KV cache", "drafter_kv_cache": "Drafter KV cache",
               "captured_features": "Captured features", "recurrent_state": "Recurrent state",
               "attention_scores": "Attention scores",
               "runtime_margin": "Runtime margin"}


class Roles(IntEnum):
    Id = Qt.ItemDataRole.UserRole + 1
    Name = Qt.ItemDataRole.UserRole + 2
    Kind = Qt.ItemDataRole.UserRole + 3
    Verdict = Qt.ItemDataRole.UserRole + 4        # fits, tight, target_only, wont_fit, unsupported, unknown
    VerdictLabel = Qt.ItemDataRole.UserRole + 5
    FitSentence = Qt.ItemDataRole.UserRole + 6
    FitDetails = Qt.ItemDataRole.UserRole + 7     # the memory breakdown, one term per line
    DownloadState = Qt.ItemDataRole.UserRole + 8  # not_downloaded, downloading, ready, error
    DownloadFraction = Qt.ItemDataRole.UserRole + 9
    DownloadText = Qt.ItemDataRole.UserRole + 10
    SizeBytes = Qt.ItemDataRole.UserRole + 11
    SizeText = Qt.ItemDataRole.UserRole + 12
    License = Qt.ItemDataRole.UserRole + 13
    Gated = Qt.ItemDataRole.UserRole + 14
    ChatMode = Qt.ItemDataRole.UserRole + 15
    Notes = Qt.ItemDataRole.UserRole + 16
    CanLoad = Qt.ItemDataRole.UserRole + 17
    Reason = Qt.ItemDataRole.UserRole + 18        # why it cannot be loaded here ("" when it can)
    TargetDir = Qt.ItemDataRole.UserRole + 19
    DraftDir = Qt.ItemDataRole.UserRole + 20      # None when only the target will run
    Subtitle = Qt.ItemDataRole.UserRole + 21      # one line under the name: size, licence, mode
    Plan = Qt.ItemDataRole.UserRole + 22          # {engine, device, dtype} the worker will load with, or None
    PlanLabel = Qt.ItemDataRole.UserRole + 23     # the same in words


@dataclass
class PairRow:
    """Everything known about one pair on this machine."""

    pair: Pair
    size_bytes: int
    fit: FitEstimate | None = None
    supported: bool = True
    device: str = ""  # this computer's device class (cuda, apple, cpu), once known
    download_state: str = "not_downloaded"
    download_fraction: float = 0.0
    download_text: str = ""
    error: str = ""
    dirs: dict = field(default_factory=dict)  # role ("target", "drafter") -> folder, when on disk
    missing: dict = field(default_factory=dict)   # engine -> why it is absent, of those that would run it here

    @property
    def verdict(self) -> str:
        if not self.supported:
            return "unsupported"
        if self.fit and self.fit.verdict == "fits" and (self.fit.plain_tok_s or SLOW_TOK_S) < SLOW_TOK_S:
            return "slow"
        return self.fit.verdict if self.fit else "unknown"

    @property
    def reason(self) -> str:
        """Plain words for why Load is off; empty when the pair can be loaded."""
        if not self.supported and self.missing:
            names = _either(ENGINES[name].label for name in self.missing)
            return (f"{self.pair.name} would run here with {names}, which this copy of the app lacks: "
                    f"{next(iter(self.missing.values()))}")
        if not self.supported:
            runs_on = _either(_a(DEVICE_LABELS[d]) if d != "cpu" else "the CPU"
                              for d in DEVICE_CLASSES if d in self.pair.device_classes)
            here = "only a CPU" if self.device == "cpu" else f"{_a(DEVICE_LABELS.get(self.device, self.device))} and a CPU"
            return f"{self.pair.name} runs only on {runs_on}, and this computer has {here}."
        if self.verdict == "wont_fit":
            return self.fit.sentence
        if self.verdict == "unknown":
            return "Checking this computer's memory…"
        if self.download_state == "downloading":
            return "Downloading…"
        if self.download_state == "error":
            return self.error
        if self.download_state != "ready":
            return "Download it first."
        return ""

    @property
    def draft_dir(self) -> str | None:
        if self.verdict == "target_only":
            return None
        return str(self.dirs["drafter"]) if self.dirs.get("drafter") else None


def pair_size(pair: Pair, catalog: Catalog, variant=None) -> int:
    """Bytes to download: the target's files (a variant's own, such as a GGUF quantization the plan runs, else
    the target in its native dtype) plus the chosen method's drafter, if it has one."""
    b = catalog.dtype_bytes
    target = variant.bytes if variant is not None else pair.target.params * b[pair.target["native_dtype"]]
    return int(target + drafter_size(pair.drafter, catalog))


def drafter_size(drafter, catalog: Catalog) -> int:
    return int(drafter.params * catalog.dtype_bytes[drafter["dtype"]]) if drafter else 0


def speculation_label(speculation, catalog: Catalog) -> tuple[str, str]:
    """One choice of the model list's speculation box: the method and what it downloads (short enough for the
    box at the picker's narrowest), and as its tooltip the engines it runs on."""
    size = (f"{human_size(drafter_size(speculation.drafter, catalog))} more" if speculation.drafter
            else "nothing more to download")
    engines = _either(ENGINES[name].label for name in speculation.engines)
    return f"{speculation.label} · {size}", f"Runs in {engines}."


def _either(words) -> str:
    """A, A or B, A, B or C."""
    words = list(words)
    return " or ".join([", ".join(words[:-1]), words[-1]]) if len(words) > 2 else " or ".join(words)


def _a(label: str) -> str:
    """The label with its article: an NVIDIA GPU, an Apple GPU, a GPU (Vulkan)."""
    return f"{'an' if label[0] in 'AEIOUN' else 'a'} {label}"


def human_size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def memory(n: int) -> str:
    """Like hardware.gib, but small terms in MB instead of a misleading '0.0 GB'."""
    return gib(n) if n >= 2**30 else f"{n / 2**20:.0f} MB"


def licence(pair: Pair) -> str:
    """Target and drafter licences, once each ("apache-2.0/mit")."""
    return "/".join(dict.fromkeys(str(m.get("license", "unknown")) for m in pair.models))


def fit_details(row: PairRow) -> str:
    """The numbers behind the verdict, one term per line."""
    if row.fit is None:
        return VERDICT_LABELS[row.verdict]
    e = row.fit
    lines = [f"{TERM_LABELS.get(k, k)}: {memory(v)}" for k, v in e.breakdown.items() if v]
    lines += [f"Total with {METHODS[row.pair.method]}: {gib(e.total_bytes)}", f"Target alone: {gib(e.target_only_bytes)}",
              f"Available: {gib(e.budget_bytes)} ({e.budget_source})",
              f"At {e.context_tokens:,} tokens of context ({e.weight_dtype} weights, {e.kv_dtype} cache)"]
    return "\n".join(lines)


def build_rows(catalog: Catalog, report: HardwareReport | None, local_dirs: dict[str, dict]) -> list[PairRow]:
    """One row per pair, demo first, each with the catalog's first speculation. `local_dirs` maps pair id ->
    {role: folder} for pairs fully on disk."""
    pairs = sorted(catalog.pairs, key=lambda p: p.kind != "embedded")  # stable: catalog order otherwise
    return [build_row(pair, catalog, report, local_dirs.get(pair.id)) for pair in pairs]


def build_row(pair: Pair, catalog: Catalog, report: HardwareReport | None, dirs: dict | None) -> PairRow:
    """One pair's row with its chosen speculation: size, fit, plan and download state."""
    row = PairRow(pair, pair_size(pair, catalog))
    if report is not None:
        row.fit = estimate_here(pair, report, dtype_bytes=catalog.dtype_bytes)
        row.supported, row.device = row.fit is not None, report.device
        if row.fit is None:
            row.missing = {name: why for name, why in report.engines_missing.items()
                           if {report.device, "cpu"} & set(pair.engines.get(name, ()))}
        if row.fit is not None and row.fit.plan is not None:
            row.size_bytes = pair_size(pair, catalog, row.fit.plan.files_variant)   # what the plan downloads
    if dirs is not None:
        row.download_state, row.dirs = "ready", dirs
    elif not pair.needs_download:
        row.download_state = "error"
        where = pair.local_path("target") or pair.target.get("package_file")
        row.error = f"The built-in model's files are missing ({where}). {pair.install_hint}"
    return row


class PairListModel(QAbstractListModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self._rows: list[PairRow] = []

    def set_rows(self, rows: list[PairRow]) -> None:
        self.beginResetModel()
        self._rows = list(rows)
        self.endResetModel()

    def replace_row(self, row: PairRow) -> None:
        """A pair's row rebuilt (another speculation chosen for it)."""
        i = self.row_of(row.pair.id)
        self._rows[i] = row
        self.dataChanged.emit(self.index(i), self.index(i))

    def row_of(self, pair_id: str) -> int:
        return next((i for i, r in enumerate(self._rows) if r.pair.id == pair_id), -1)

    def pair_row(self, row: int) -> PairRow:
        return self._rows[row]

    def set_download(self, pair_id: str, state: str, fraction: float = 0.0, text: str = "", error: str = "",
                     dirs: dict | None = None) -> None:
        i = self.row_of(pair_id)
        if i < 0:
            return
        r = self._rows[i]
        r.download_state, r.download_fraction, r.download_text, r.error = state, fraction, text, error
        if dirs is not None:
            r.dirs = dirs
        self.dataChanged.emit(self.index(i), self.index(i))

    # -- Qt interface -----------------------------------------------------------------------------
    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._rows)

    def roleNames(self) -> dict[int, bytes]:
        names = {int(r): (r.name[0].lower() + r.name[1:]).encode() for r in Roles}
        names[int(Qt.ItemDataRole.DisplayRole)] = b"display"
        return names

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        r = self._rows[index.row()]
        p = r.pair
        if role in (Qt.ItemDataRole.DisplayRole, Roles.Name):
            return p.name
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{VERDICT_LABELS[r.verdict]}\n{fit_details(r)}"
        getters = {
            Roles.Id: lambda: p.id,
            Roles.Kind: lambda: p.kind,
            Roles.Verdict: lambda: r.verdict,
            Roles.VerdictLabel: lambda: VERDICT_LABELS[r.verdict],
            Roles.FitSentence: lambda: r.fit.sentence if r.fit else r.reason,
            Roles.FitDetails: lambda: fit_details(r),
            Roles.DownloadState: lambda: r.download_state,
            Roles.DownloadFraction: lambda: r.download_fraction,
            Roles.DownloadText: lambda: self._download_text(r),
            Roles.SizeBytes: lambda: r.size_bytes,
            Roles.SizeText: lambda: human_size(r.size_bytes),
            Roles.License: lambda: licence(p),
            Roles.Gated: lambda: p.gated,
            Roles.ChatMode: lambda: p.chat_mode,
            Roles.Notes: lambda: p.notes,
            Roles.CanLoad: lambda: not r.reason,
            Roles.Reason: lambda: r.reason,
            Roles.TargetDir: lambda: str(r.dirs["target"]) if r.dirs.get("target") else None,
            Roles.DraftDir: lambda: r.draft_dir,
            Roles.Subtitle: lambda: self._subtitle(r),
            Roles.Plan: lambda: r.fit.plan.request if r.fit and r.fit.plan else None,
            Roles.PlanLabel: lambda: r.fit.plan.label if r.fit and r.fit.plan else "",
        }
        getter = getters.get(role)
        return getter() if getter else None

    @staticmethod
    def _download_text(r: PairRow) -> str:
        if r.pair.kind == "embedded":
            return "Built in · ready" if r.download_state == "ready" else "Built in · not installed"
        return {"ready": "Downloaded · ready", "not_downloaded": "Not downloaded",
                "downloading": r.download_text or "Downloading…",
                "error": "Download failed (why, below)"}[r.download_state]

    @staticmethod
    def _subtitle(r: PairRow) -> str:
        p = r.pair
        parts = [human_size(r.size_bytes), licence(p), "any chat mode" if p.chat_mode == "any" else p.chat_mode]
        if p.gated:
            parts.append("gated")
        return " · ".join(parts)


def local_dirs_for(catalog: Catalog, find_cached, report: HardwareReport | None = None) -> dict[str, dict]:
    """Which pairs are complete on disk with the catalog's first speculation (disk only, no network); slow-ish,
    so call it off the GUI thread."""
    found = {}
    for pair in catalog.pairs:
        dirs = pair_dirs(pair, find_cached, report, catalog.dtype_bytes)
        if dirs is not None:
            found[pair.id] = dirs
    return found


def pair_dirs(pair: Pair, find_cached, report: HardwareReport | None = None,
              dtype_bytes: dict | None = None) -> dict | None:
    """{role: folder} of a pair with its chosen speculation when all of it is on disk, else None. A pair whose
    planned engine has its own files (a GGUF variant) is ready when those are."""
    if pair.kind == "embedded":
        return {"target": pair.local_path("target"), "drafter": pair.local_path("drafter")} \
            if pair.installed() else None
    fit = estimate_here(pair, report, dtype_bytes=dtype_bytes) if report else None
    plan = fit.plan if fit else None
    if plan is not None and plan.variant is not None:
        dirs = {"target": variant_folder.assemble(pair, plan.variant)}
    else:
        dirs = {"target": find_cached(pair.target.repo_id, pair.target.revision)}
    if pair.drafter is not None:
        dirs["drafter"] = find_cached(pair.drafter.repo_id, pair.drafter.revision)
    return dirs if all(dirs.values()) else None     # a half-downloaded pair is not ready; Download resumes it
