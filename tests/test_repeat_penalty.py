"""Answers that do not loop: the repeat penalty (every verify row with its own window, so speculation keeps the
target's output), min-p, the loop guard, per-chat seed and context length, and starter cards that complete.
The penalty is checked against a reference written here (a full forward per token, the rule applied by hand) on
SmolLM2, where greedy decoding without it loops; llama.cpp's side is in test_llamacpp_engine.py."""
from __future__ import annotations

import pytest

from dflash_desktop import settings as settings_mod
from engine.bench import DEMO_DIR
from engine.limits import REPEAT_WINDOW, GenerationSettings
from engine.loop import Generation
from engine.penalties import History, LoopGuard

from .ui_chat_fixtures import chat_worker, echo_pair, home, make_window, send_and_wait  # noqa: F401

PIRATE = [{"role": "user", "content": "Talk like a pirate and greet me."}]   # greedy SmolLM2 loops on it


def test_each_verify_row_sees_the_tokens_before_it_within_the_window():
    history = History(list(range(100)))
    assert history.tokens == list(range(100 - REPEAT_WINDOW, 100))
    rows = history.windows(500, [501, 502])
    assert rows[0] == list(range(101 - REPEAT_WINDOW, 100)) + [500]
    assert rows[2] == list(range(103 - REPEAT_WINDOW, 100)) + [500, 501, 502]
    assert all(len(row) == REPEAT_WINDOW for row in rows)
    history.advance(500, [501, 502], 1)
    assert history.tokens[-2:] == [500, 501] and len(history.tokens) == REPEAT_WINDOW
    assert History([7]).windows(8, [9]) == [[7, 8], [7, 8, 9]]


def pushed(guard: LoopGuard, tokens: list[int]) -> int | None:
    """The index of the token at which the guard stops, None when it never does."""
    return next((i for i, t in enumerate(tokens) if guard.push(t)), None)


def test_the_loop_guard_stops_a_repeated_phrase_and_nothing_else():
    aye = [5, 9] * 100                                           # ", aye" over and over
    assert pushed(LoopGuard(64), aye) == 63                      # once 64 tokens are the phrase
    assert pushed(LoopGuard(0), aye) is None                     # 0: off
    assert pushed(LoopGuard(64), [0, 1] * 10 + list(range(2, 200))) is None   # ten zeros in a list: no loop
    sentence = list(range(100, 140))                             # 40 tokens: longer than 64 / 3
    assert pushed(LoopGuard(64), sentence * 2) is None           # said twice is not a loop
    assert pushed(LoopGuard(64), sentence * 3) == 119            # the third time through is
    prose = [i * 7919 % 1000 for i in range(3000)]               # long, varied
    assert pushed(LoopGuard(64), prose) is None


@pytest.fixture(scope="module")
def smol(smollm2):
    from engine.backends import load_pair
    return load_pair("torch", smollm2.hf_folder(), smollm2.DRAFT_DIR, device="cpu")


def reference(pair, prompt: list[int], n: int, penalty: float) -> list[int]:
    """Greedy decoding by hand: the whole sequence through the model for every token, seen tokens penalised."""
    import torch
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = pair.target.model(torch.tensor([ids])).logits[0, -1].double()
            for t in set(ids[-REPEAT_WINDOW:]):
                logits[t] = logits[t] / penalty if logits[t] > 0 else logits[t] * penalty
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


def test_penalised_greedy_decoding_is_the_reference_and_dflash_keeps_it(smol):
    ids = smol.tokenizer.encode_chat(PIRATE)
    free = Generation(smol, ids, GenerationSettings(max_new_tokens=48), baseline=True).run()
    assert pushed(LoopGuard(24), free.tokens) is not None, "greedy SmolLM2 loops here"
    settings = GenerationSettings(max_new_tokens=48, repeat_penalty=1.1)
    plain = Generation(smol, ids, settings, baseline=True).run()
    assert plain.tokens == reference(smol, ids, 48, 1.1)
    assert plain.tokens != free.tokens and pushed(LoopGuard(24), plain.tokens) is None
    fast = Generation(smol, ids, GenerationSettings(max_new_tokens=48, repeat_penalty=1.1, plain_fallback=False)).run()
    assert fast.tokens == plain.tokens and fast.stats.accepted > 0


@pytest.mark.parametrize("engine", ["torch", "mlx"])
def test_a_draft_repeated_within_its_block_is_penalised_as_plain_decoding_would(engine):
    """Right after a short prompt a block's drafts repeat tokens the history lacks: each verify row must see the
    drafts before it (the same window for the whole block gives other tokens here)."""
    if engine == "mlx":
        pytest.importorskip("mlx_lm")
    from engine.backends import load_pair
    pair = load_pair(engine, DEMO_DIR / "target", DEMO_DIR / "draft", device="cpu")
    settings = GenerationSettings(max_new_tokens=40, repeat_penalty=1.5, plain_fallback=False, draft_cutoff=0.0)
    changed = 0
    for text in ("class A:", "x = ["):
        ids = pair.tokenizer.encode_prompt(text, raw=True)
        plain = Generation(pair, ids, settings, baseline=True).run()
        fast = Generation(pair, ids, settings).run()
        assert fast.tokens == plain.tokens and fast.stats.accepted > 0, text
        changed += plain.tokens != Generation(pair, ids, GenerationSettings(max_new_tokens=40), baseline=True).run().tokens
    assert changed, "the penalty changes what the engine writes"


def test_min_p_leaves_greedy_alone_and_a_seeded_sample_repeats(smol):
    ids = smol.tokenizer.encode_chat(PIRATE)
    greedy = [Generation(smol, ids, GenerationSettings(max_new_tokens=16, min_p=p)).run().tokens for p in (0, 0.5)]
    assert greedy[0] == greedy[1]
    sampled = [Generation(smol, ids, GenerationSettings(max_new_tokens=24, temperature=1.0, min_p=0.2, seed=3,
                                                        repeat_penalty=1.2)).run().tokens for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_the_code_pairs_starter_cards_complete_under_the_default_settings():
    """The starter cards of the code pair run to max tokens without looping: what a new user clicks first."""
    from engine.backends import load_pair
    from ui.chat_view import CODE_EXAMPLES
    pair = load_pair("torch", DEMO_DIR / "target", DEMO_DIR / "draft", device="cpu")
    settings = GenerationSettings(**settings_mod.Settings().generation(pair.block_size))
    assert settings.repeat_penalty > 1 and settings.loop_guard
    for text in CODE_EXAMPLES:
        run = Generation(pair, pair.tokenizer.encode_prompt(text, raw=True), settings).run()
        assert run.stop_reason == "length", f"{text!r} stopped: {run.stop_reason}"


def test_the_loop_guard_ends_an_answer_and_says_so_in_the_window(qtbot, home, chat_worker, echo_pair):
    """The echo pair repeats one token forever; the answer stops at the guard's span and its footer says why."""
    window = make_window(qtbot, chat_worker, echo_pair, settings_mod.Settings(draft_cutoff=0.0, max_new_tokens=200,
                                                                              loop_guard=32))
    done = send_and_wait(qtbot, window, "hi")
    assert done["stop_reason"] == "loop" and done["stats"]["generated_tokens"] == 32
    answer = [w for w in window.chat_view.messages if w.role == "assistant"][-1]
    assert "repeating itself" in answer.footer.text()


def test_a_chats_own_seed_and_context_length_reach_the_engine(qtbot, home, chat_worker, echo_pair):
    window = make_window(qtbot, chat_worker, echo_pair, settings_mod.Settings(draft_cutoff=0.0, max_new_tokens=12,
                                                                              temperature=1.0))
    texts = [send_and_wait(qtbot, window, "a")["text"] for _ in range(2)]
    assert texts[0] != texts[1], "without a seed every answer samples anew"
    window.controller.set_chat_overrides({"seed": 11, "repeat_penalty": 1.5})
    assert window.chat_view.chat_settings.text() == "Chat: seed 11, repeat penalty 1.5"
    seeded = [send_and_wait(qtbot, window, "a")["text"] for _ in range(2)]
    assert seeded[0] == seeded[1]
    window.controller.set_chat_overrides({"context_length": 24})
    assert window.chat_view.context_limit == 24
    done = send_and_wait(qtbot, window, "a")
    assert done["event"] == "error" and "context length setting allows 24" in done["message"]
    window.controller.new_chat()
    assert window.chat_view.context_limit == window.session.loaded.max_positions
