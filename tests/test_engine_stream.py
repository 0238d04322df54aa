"""Engines that run their own speculative loop (a llama-server, a remote server) stream tokens to the same
decode loop: the loop's stop rules, text and statistics apply, and stopping closes the engine's stream.
The engine here is a real one run as such a server would: the torch engine's plain steps, streamed."""
import pytest
import torch

from tests.tiny_torch import random_pair
from engine.limits import GenerationSettings
from engine.loop import Chunk, Generation


class StreamedTorch:
    """A torch pair driven by its own loop, token by token, reporting totals the way a server does."""

    capabilities = frozenset({"stream"})

    def __init__(self, pair, report_steps: bool = True):
        self.pair, self.report_steps = pair, report_steps
        self.info, self.tokenizer, self.eos_ids = pair.info, pair.tokenizer, pair.eos_ids
        self.block_size, self.max_positions = pair.block_size, pair.max_positions
        self.closed = self.sent = 0

    def stream(self, prompt, settings, baseline):
        token, pos = self.pair.prefill(prompt, settings, drafting=False), len(prompt)
        try:
            while True:
                self.sent += 1
                yield Chunk([token], [False])
                if self.sent == 40:
                    yield Chunk([], totals={"drafted": 30, "accepted": 20, "steps": 10 if self.report_steps else None})
                    return
                _, token = self.pair.verify(token, pos, [])
                pos += 1
                self.pair.commit(pos)
        except GeneratorExit:
            self.closed += 1
            raise

    def memory(self):
        return self.pair.memory()


@pytest.fixture(scope="module")
def pair():
    return random_pair("qwen3", seed=3, vocab=256, hidden=64, layers=4, max_positions=512)


def prompt_of(n, seed=0):
    return torch.randint(0, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_streamed_answer_equals_the_step_loops_and_ends_when_the_engine_does(pair):
    prompt = prompt_of(30, seed=1)
    engine = StreamedTorch(pair)
    run = Generation(engine, prompt, GenerationSettings(max_new_tokens=100)).run()
    ref = Generation(pair, prompt, GenerationSettings(max_new_tokens=40), baseline=True).run()
    assert run.tokens == ref.tokens and run.stop_reason == "eos"
    assert (run.stats.drafted, run.stats.accepted, run.stats.steps) == (30, 20, 10)
    assert run.stats.tau == 3.0 and run.stats.unknown == () and run.stats.ttft_s > 0


def test_the_loops_stop_rules_close_the_engines_stream(pair):
    prompt = prompt_of(30, seed=2)
    ref = Generation(pair, prompt, GenerationSettings(max_new_tokens=40), baseline=True).run().tokens
    engine = StreamedTorch(pair)
    run = Generation(engine, prompt, GenerationSettings(max_new_tokens=7)).run()
    assert run.tokens == ref[:7] and run.stop_reason == "length"
    assert engine.closed == 1 and engine.sent == 7, "the engine must stop when the loop does"
    pair.eos_ids = (ref[5],) if ref[5] not in ref[:5] else (ref[9],)
    try:
        run = Generation(StreamedTorch(pair), prompt, GenerationSettings(max_new_tokens=40)).run()
    finally:
        pair.eos_ids = ()
    assert run.stop_reason == "eos" and len(run.tokens) in (5, 9)


def test_cancel_closes_the_stream_and_counts_it_left_unreported_stay_unknown(pair):
    engine = StreamedTorch(pair, report_steps=False)
    run = Generation(engine, prompt_of(20, seed=3), GenerationSettings(max_new_tokens=40))
    steps = []
    for step in run:
        steps.append(step)
        if len(steps) == 3:
            run.cancel()
    assert run.stop_reason == "cancelled" and engine.closed == 1 and len(run.tokens) == 3
    done = Generation(StreamedTorch(pair, report_steps=False), prompt_of(20, seed=3),
                      GenerationSettings(max_new_tokens=100)).run()
    assert done.stats.unknown == ("steps",) and done.stats.tau == 0.0
    assert done.stats.to_dict()["unknown"] == ["steps"]
