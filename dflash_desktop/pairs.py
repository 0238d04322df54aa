"""What the window asks to load and what loaded, as types: a `PairRequest` comes from the catalog, the model
picker, the Open dialog, a server or the settings; a `LoadedPair` is the worker's (or a server's) `loaded`
event, read once (docs/PROTOCOL.md). The settings keep a request as its dict (`to_dict`)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from engine.backends import ENGINES, METHODS

from .offers import Offers
from .run_plan import AUTO

PLAN_KEYS = {"engine", "device", "dtype"}          # run_plan.RunPlan.request: the load_pair fields
REMOTE_KEYS = {"base_url", "api_key", "model"}     # QtWorker.load_remote's arguments


def _texts(d: dict, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> bool:
    return all(isinstance(d.get(k), str) for k in required) and all(
        d.get(k) is None or isinstance(d[k], str) for k in optional)


def _is_plan(plan) -> bool:
    return plan is None or (isinstance(plan, dict) and set(plan) <= PLAN_KEYS and
                            _texts(plan, ("engine", "device"), ("dtype",)) and
                            (plan["engine"] == "auto" or plan["engine"] in ENGINES))


def measured_key(pair_id: str, draft_dir: str | None) -> str:
    """Where the settings keep what loading a pair measured fastest: per pair and drafter folder, as two drafters
    of one target (or none, for n-gram lookup) calibrate on different files."""
    return f"{pair_id}|{draft_dir or ''}"


@dataclass(frozen=True)
class PairRequest:
    id: str                             # the catalog id, "local:<path>" or "remote:<url>": baselines are per id
    name: str
    target_dir: str | None = None       # a folder or a GGUF; None for a server
    draft_dir: str | None = None
    plan: dict | None = None            # {engine, device, dtype} (run_plan.py); None: the engine's own choice
    planned: dict | None = None         # the model picker's plan, which wins where the settings' engine allows
    thinking: bool | None = None        # the drafter was trained with thinking on/off (None: not said)
    remote: dict | None = None          # {base_url, api_key} for a pair on an OpenAI-compatible server

    @classmethod
    def of(cls, given: "PairRequest | dict") -> "PairRequest":
        """From a request or its dict (stored settings, tests): a catalog or local pair {id, name, target_dir,
        draft_dir, plan, planned, thinking}, or a server {id, name, remote: {base_url, api_key}}."""
        if isinstance(given, cls):
            return given
        if not cls.valid(given):
            raise ValueError("This is not a model pair this version can load: {id, name, target_dir, draft_dir, "
                             "plan, thinking}, or {id, name, remote: {base_url, api_key}}.")
        return cls(**{**given, "name": given.get("name") or ""})

    @classmethod
    def valid(cls, pair) -> bool:
        if not (isinstance(pair, dict) and set(pair) <= {f.name for f in fields(cls)}
                and _texts(pair, ("id",), ("name",))):
            return False
        if "remote" in pair:
            remote = pair["remote"]
            return (isinstance(remote, dict) and set(remote) <= REMOTE_KEYS and
                    _texts(remote, ("base_url",), ("api_key", "model")))
        return (_texts(pair, ("target_dir",), ("draft_dir",)) and _is_plan(pair.get("plan")) and
                _is_plan(pair.get("planned")) and pair.get("thinking") in (None, True, False))

    def to_dict(self) -> dict:
        """The fields that are set, as the settings store them."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None or f.name in ("id", "name")}

    @property
    def key(self) -> str:
        """Baselines are per target on this machine: the pair id plus the target folder."""
        return f"{self.id}|{self.target_dir or ''}"

    @property
    def measured_key(self) -> str:
        return measured_key(self.id, self.draft_dir)

    def baseline_key(self, engine: str | None) -> str:
        """Baselines are per pair, engine and machine (the settings are this machine's): plain decoding of the
        same target in the same engine, the only fair denominator for that engine's speculation."""
        return f"{self.key}|{engine or ''}"

    @property
    def run_plan(self) -> dict:
        return self.plan or AUTO

    def with_plan(self, **plan) -> "PairRequest":
        return replace(self, plan={**self.run_plan, **plan})

    def named(self, name: str) -> "PairRequest":
        return replace(self, name=name)


@dataclass(frozen=True)
class LoadedPair:
    name: str
    device: str
    engine: str | None = None
    dtype: str | None = None
    block_size: int | None = None
    has_drafter: bool = False
    chat_template: bool = False         # the target formats chats itself (else prompts go as they are)
    supports_thinking: bool = False
    max_positions: int = 0              # the context the model takes (0: not said)
    load_s: float = 0.0
    target: str | None = None
    base_url: str | None = None         # a server's
    speculation: dict | None = None     # the engine's own choice of DFlash settings or plain decoding, and why
    engine_note: str | None = None      # the worker's engine pick could not run the pair: what ran instead
    engine_choice: dict | None = None   # the engines that run the pair here, timed: which won and why (engine/fastest.py)
    offers: Offers = field(default_factory=Offers)
    event: dict = field(default_factory=dict, repr=False, compare=False)   # the event itself (memory figures)

    @property
    def where(self) -> str:
        """The device in words: the GPU by its name, and how many layers it holds when not all of them."""
        gpu, layers = self.event.get("gpu"), self.event.get("gpu_layers")
        if not gpu:
            return self.device
        total = self.event.get("layers") or 0
        part = f", {layers} of {total} layers" if layers and total and layers < total else ""
        return f"{self.device} ({gpu}{part})"

    @property
    def engine_reasons(self) -> list[str]:
        """Why this engine runs the pair, where the worker said: the engines timed against each other here, or
        its own pick that could not run the pair."""
        return [why for why in ((self.engine_choice or {}).get("reason"), self.engine_note) if why]

    @property
    def device_note(self) -> str | None:
        """Why the model runs elsewhere than asked, or only partly on the GPU (the engine's words)."""
        return self.event.get("device_note")

    @property
    def method(self) -> str:
        """How answers speculate (engine.backends.METHODS): the engine's measured choice where it made one, else
        DFlash with a drafter and plain decoding without."""
        return self.event.get("method") or ("dflash" if self.has_drafter else "none")

    @property
    def speculates(self) -> bool:
        """Answers may draft (a drafter, or a method that needs none such as n-gram lookup): acceptance and
        speedup have something to show."""
        return self.has_drafter or self.method != "none"

    @property
    def method_label(self) -> str:
        return METHODS.get(self.method if self.method != "none" else "dflash", "DFlash")

    @property
    def measured(self) -> str | None:
        """What the engine measured fastest for this pair on this computer, and why, in words (None: it measured
        nothing, so answers run as the files say)."""
        spec, race = self.speculation or {}, (self.engine_choice or {}).get("summary")
        if not spec.get("reason"):
            return f"{ENGINES[self.engine].label if self.engine in ENGINES else self.engine}. {race}" if race else None
        what = ("plain decoding" if self.method == "none" else
                f"{self.method_label}, {spec['n_max']} drafts a step" if spec.get("n_max") else self.method_label)
        return f"{what}. {spec['reason']}" + (f" {race}" if race else "")

    @classmethod
    def of(cls, event: dict) -> "LoadedPair":
        return cls(name=str(event.get("name") or ""), device=str(event.get("device") or "cpu"),
                   engine=event.get("engine"), dtype=event.get("dtype"), block_size=event.get("block_size"),
                   has_drafter=bool(event.get("has_drafter")), chat_template=bool(event.get("chat_template")),
                   supports_thinking=bool(event.get("supports_thinking")),
                   max_positions=int(event.get("max_positions") or 0), load_s=float(event.get("load_s") or 0.0),
                   target=event.get("target"), base_url=event.get("base_url"),
                   speculation=event.get("speculation"), engine_note=event.get("engine_note"),
                   engine_choice=event.get("engine_choice") if isinstance(event.get("engine_choice"), dict) else None,
                   offers=Offers.of(event),
                   event=dict(event))
