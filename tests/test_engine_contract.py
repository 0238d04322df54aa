"""The engine contract (engine/backends/__init__.py, docs/ENGINES.md): what each engine declares in
`capabilities` is what its class implements, and the one loop asks for nothing an engine did not declare:
it runs here over a real torch pair seen through a proxy that fails on any other attribute (a probe with
hasattr or getattr fails too, since the proxy raises something other than AttributeError)."""
from __future__ import annotations

import threading

import pytest

from engine.backends import CAPABILITIES
from engine.limits import GenerationSettings
from engine.loop import Chunk, Generation, StepCosts
from tests.tiny_torch import random_pair

STEP_OPERATIONS = ("prefill", "draft", "verify", "commit", "stop_drafting", "memory")
STREAM_OPERATIONS = ("stream", "memory")
ATTRIBUTES = ("info", "tokenizer", "eos_ids", "block_size", "max_positions", "capabilities")
OPTIONAL = ("stop_drafting", "interrupt", "plain_step_s", "close", "prepare")


def engine_classes():
    from engine.backends.llamacpp.engine import LlamaCppPair
    from engine.backends.torch.cuda import CudaPair
    from engine.backends.torch.eager import TorchPair
    classes = [TorchPair, CudaPair, LlamaCppPair]
    try:
        from engine.backends.mlx.engine import MlxPair
    except ImportError:       # mlx is optional; where it is installed (CI: mlx[cpu]) its pair is checked too
        return classes
    return [*classes, MlxPair]


@pytest.mark.parametrize("cls", engine_classes(), ids=lambda c: c.__name__)
def test_declared_capabilities_are_what_the_class_implements(cls):
    declared = cls.capabilities
    assert isinstance(declared, frozenset) and declared <= set(CAPABILITIES)
    streams = "stream" in declared
    assert streams == hasattr(cls, "stream")
    for op in STREAM_OPERATIONS if streams else STEP_OPERATIONS:
        assert callable(getattr(cls, op, None)), f"{cls.__name__} declares no {op}"
    for name in OPTIONAL:
        if name == "stop_drafting" and not streams:
            continue                  # a step engine's stop_drafting is an operation, not a capability
        assert (name in declared) == hasattr(cls, name), f"{cls.__name__}: {name}"


class Strict:
    """A pair as the loop may see it: its contract's attributes and operations and the declared
    capabilities; anything else fails the test."""

    def __init__(self, pair, capabilities=None, operations=STEP_OPERATIONS):
        caps = pair.capabilities if capabilities is None else capabilities
        allowed = set(ATTRIBUTES) | set(operations) | {c for c in caps if c != "stream"}
        if "interrupt" in caps:
            allowed.add("cancelled")        # the loop hands an interruptible engine its cancel flag
        object.__setattr__(self, "_pair", pair)
        object.__setattr__(self, "_allowed", allowed)
        object.__setattr__(self, "_caps", frozenset(caps))
        object.__setattr__(self, "asked", set())

    def __getattr__(self, name):
        self.asked.add(name)
        if name not in self._allowed:
            raise AssertionError(f"the loop asked for {name!r}, which this engine did not declare")
        return self._caps if name == "capabilities" else getattr(self._pair, name)

    def __setattr__(self, name, value):
        if name not in self._allowed:
            raise AssertionError(f"the loop set {name!r} on an engine that did not declare it")
        setattr(self._pair, name, value)


@pytest.fixture(scope="module")
def pair():
    return random_pair("qwen3", seed=5, block_size=8)


def test_the_loop_runs_a_step_engine_through_its_contract_only(pair):
    prompt = list(range(3, 20))
    strict = Strict(pair)
    plain = Generation(strict, prompt, GenerationSettings(max_new_tokens=24), baseline=True).run()
    costs = StepCosts()
    costs.plain.append(1e-9)             # no DFlash step keeps pace: the fallback judges and stops drafting
    fast = Generation(strict, prompt, GenerationSettings(max_new_tokens=120), costs=costs).run()
    assert fast.fallback is not None and fast.tokens[:24] == plain.tokens
    assert {"prefill", "draft", "verify", "commit", "stop_drafting"} <= strict.asked
    gen = Generation(strict, prompt, GenerationSettings(max_new_tokens=50))
    for _ in gen:
        gen.cancel()                         # a step engine has no interrupt: the loop must not ask for one
    assert gen.stop_reason == "cancelled"


class Streamed:
    """A streaming engine made of the torch pair's plain steps, declaring only "stream"."""

    capabilities = frozenset({"stream"})

    def __init__(self, pair):
        self.pair = pair
        self.info, self.tokenizer, self.eos_ids = pair.info, pair.tokenizer, pair.eos_ids
        self.block_size, self.max_positions = pair.block_size, pair.max_positions

    def stream(self, prompt, settings, baseline):
        token, pos = self.pair.prefill(prompt, settings, drafting=False), len(prompt)
        for _ in range(settings.max_new_tokens):
            yield Chunk([token], [False])
            _, token = self.pair.verify(token, pos, [])
            pos += 1
            self.pair.commit(pos)

    def memory(self):
        return self.pair.memory()


def test_the_loop_runs_a_streaming_engine_through_its_contract_only(pair):
    prompt = list(range(3, 20))
    strict = Strict(Streamed(pair), operations=STREAM_OPERATIONS)
    reference = Generation(pair, prompt, GenerationSettings(max_new_tokens=30), baseline=True).run().tokens
    run = Generation(strict, prompt, GenerationSettings(max_new_tokens=30)).run()   # DFlash asked: no fallback
    assert run.tokens == reference and "stop_drafting" not in strict.asked
    gen = Generation(strict, prompt, GenerationSettings(max_new_tokens=30))
    stopper = threading.Timer(0, gen.cancel)
    stopper.start()
    stopper.join()
    assert list(gen)[-1].stop_reason == "cancelled" and "interrupt" not in strict.asked


def test_an_undeclared_probe_fails_the_proxy(pair):
    """The check itself: asking for an operation the engine did not declare fails, even through hasattr."""
    strict = Strict(pair)
    with pytest.raises(AssertionError, match="interrupt"):
        hasattr(strict, "interrupt")
