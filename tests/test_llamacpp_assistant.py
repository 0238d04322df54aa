"""Gemma 4 assistants (the MTP drafter Gemma 4 ships as a checkpoint of its own) told apart and checked without a
build: a folder's config names the kind (mtp) and sends the pair to llama.cpp; it converts with its target's
tokenizer; one made for another model is refused by name, from its config before converting and from its GGUF
header before a server starts (the end-to-end run: tests/test_llamacpp_methods.py)."""
import json

import pytest

from engine import gguf_metadata as metadata
from engine.backends.choice import auto_engine
from engine.backends.llamacpp import convert
from engine.backends.llamacpp.engine import DRAFTER_ARCHS, drafter_block
from engine.errors import PairMismatchError

# a Gemma 4 target's header as llama.cpp's converter writes it (a tiny one: 5 layers, the last two sharing keys
# and values), and its assistant's (2 layers, each reading the target's last layer of its kind)
TARGET = {"general.architecture": "gemma4", "gemma4.block_count": 5, "gemma4.embedding_length": 64,
          "gemma4.attention.head_count_kv": 2, "gemma4.attention.key_length": 32,
          "gemma4.attention.key_length_swa": 16,
          "gemma4.attention.sliding_window_pattern": [True, True, False, True, False],
          "tokenizer.ggml.tokens": metadata.ArrayLength(4352)}
ASSISTANT = {"general.architecture": "gemma4-assistant", "gemma4-assistant.block_count": 2,
             "gemma4-assistant.embedding_length": 32, "gemma4-assistant.embedding_length_out": 64,
             "gemma4-assistant.attention.head_count_kv": 2, "gemma4-assistant.attention.key_length": 32,
             "gemma4-assistant.attention.key_length_swa": 16,
             "gemma4-assistant.attention.sliding_window_pattern": [True, False],
             "tokenizer.ggml.tokens": metadata.ArrayLength(4352), "gguf.tensors": frozenset({"token_embd.weight"})}
ASSISTANT_CONFIG = {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
                    "backbone_hidden_size": 64, "text_config": {"model_type": "gemma4_text", "hidden_size": 32,
                                                                "vocab_size": 4352}}
TARGET_CONFIG = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
                 "text_config": {"model_type": "gemma4_text", "hidden_size": 64, "vocab_size": 4352}}


def test_an_assistant_drafts_for_mtp_one_token_a_pass():
    assert convert.drafter_kind(ASSISTANT_CONFIG) == "mtp"
    assert convert.drafter_kind({"architectures": ["Gemma4UnifiedAssistantForCausalLM"]}) == "mtp"
    assert metadata.drafter_method(ASSISTANT) == "mtp" and "gemma4-assistant" in DRAFTER_ARCHS
    assert drafter_block(ASSISTANT) == 4            # MTP's longest calibrated draft (3) + the target's own token
    metadata.check_pair(TARGET, ASSISTANT, "gemma.gguf", "assistant.gguf")


def test_an_assistant_folder_goes_to_llamacpp_and_fits_its_target(tmp_path):
    for name, cfg in (("target", TARGET_CONFIG), ("assistant", ASSISTANT_CONFIG)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    assert auto_engine(tmp_path / "target", "cpu", tmp_path / "assistant") == "llamacpp"
    convert.check_assistant(ASSISTANT_CONFIG, tmp_path / "assistant", tmp_path / "target")   # made for it


def test_a_refused_assistant_names_llamacpp_as_the_way_out(tmp_path, monkeypatch):
    """The torch engine refuses a Gemma 4 assistant naming llama.cpp, and the worker offers llama.cpp as the way out
    (runs_what_was_refused) when it is built here; never llama.cpp's own refusal, nor a drafter it cannot convert."""
    from engine.backends import choice
    from engine.config import generation_of
    from engine.errors import CheckpointError
    for name, cfg in (("target", TARGET_CONFIG), ("assistant", ASSISTANT_CONFIG), ("other", {"architectures": ["X"]})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    with pytest.raises(CheckpointError, match="Gemma4AssistantForCausalLM.*Load the pair with the llama.cpp engine"):
        generation_of(ASSISTANT_CONFIG)
    monkeypatch.setattr(choice, "missing_engines", lambda: {})
    load = {"target": str(tmp_path / "target"), "draft": str(tmp_path / "assistant")}
    assert choice.runs_what_was_refused(load, "torch") == choice.runs_what_was_refused(load, "mlx") == ["llamacpp"]
    assert choice.runs_what_was_refused(load, "llamacpp") == []
    assert choice.runs_what_was_refused({**load, "draft": str(tmp_path / "other")}, "torch") == []
    monkeypatch.setattr(choice, "missing_engines", lambda: {"llamacpp": "not built"})
    assert choice.runs_what_was_refused(load, "torch") == []


@pytest.mark.parametrize("target, draft, message", [
    ({"general.architecture": "qwen3", "qwen3.embedding_length": 64}, {}, "drafts for a Gemma 4 model only, and "
     "gemma.gguf is 'qwen3'"),
    ({}, {"gemma4-assistant.embedding_length_out": 48}, "has hidden size 48 but gemma.gguf has 64"),
    ({}, {"tokenizer.ggml.tokens": metadata.ArrayLength(4096)}, "has vocabulary 4096 but gemma.gguf has 4352"),
    ({}, {"gemma4-assistant.attention.key_length": 64}, "reads keys of 2 heads of 64 in its full attention layers "
     "but gemma.gguf's last full attention layer stores 2 heads of 32"),
    ({"gemma4.attention.head_count_kv": [2, 2, 2, 1, 2]}, {}, "reads keys of 2 heads of 16 in its sliding attention "
     "layers but gemma.gguf's last sliding attention layer stores 1 heads of 16"),
    ({"gemma4.attention.head_count_kv": [2, 2, 4, 2, 4], "gemma4.attention.key_length": 16}, {},   # as wide
     "reads keys of 2 heads of 32 in its full attention layers but .* stores 4 heads of 16"),
    ({"general.architecture": "gemma4-assistant"}, {}, "gemma.gguf is a drafter .*Swap the two files"),
])
def test_an_assistant_gguf_for_another_model_is_refused_by_name(target, draft, message):
    with pytest.raises(PairMismatchError, match=message):
        metadata.check_pair({**TARGET, **target}, {**ASSISTANT, **draft}, "gemma.gguf", "assistant.gguf")


@pytest.mark.parametrize("target, draft, message", [
    ({"model_type": "qwen3", "text_config": None, "hidden_size": 64, "vocab_size": 4352}, {}, "drafts for a Gemma 4 "
     "model only, and target is 'qwen3'"),
    ({}, {"backbone_hidden_size": 48}, "assistant for a model of hidden size 48, but target has hidden size 64"),
    ({}, {"text_config": {"vocab_size": 4096}}, "a model of vocabulary 4096, but target has vocabulary 4352"),
])
def test_an_assistant_folder_for_another_model_is_refused_before_converting(tmp_path, target, draft, message):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps({**TARGET_CONFIG, **target}), encoding="utf-8")
    with pytest.raises(PairMismatchError, match=message):
        convert.check_assistant({**ASSISTANT_CONFIG, **draft}, tmp_path / "assistant", tmp_path / "target")


def test_an_assistant_converts_with_its_targets_tokenizer(tmp_path):
    """llama.cpp's assistant converter reads the tokenizer of the folder it converts (no --target-model-dir): the
    staging folder holds the assistant's config and weights and the target's tokenizer, never the assistant's."""
    for name, files in (("assistant", ("config.json", "model.safetensors", "tokenizer.json", "run_me.py")),
                        ("target", ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"))):
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f).write_text(f"{name} {f}", encoding="utf-8")
    staged = convert._stage(tmp_path / "assistant", tmp_path / "stage", with_weights=True,
                            tokenizer=tmp_path / "target")
    assert {f.name: f.read_text(encoding="utf-8") for f in staged.iterdir()} == {
        "config.json": "assistant config.json", "model.safetensors": "assistant model.safetensors",
        "tokenizer.json": "target tokenizer.json", "tokenizer_config.json": "target tokenizer_config.json"}
