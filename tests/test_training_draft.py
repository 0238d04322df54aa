"""The drafter training pipeline: the block-sparse mask, a tiny end-to-end run, and input errors."""
import json
import subprocess
import sys

import pytest
import torch

from engine.backends.torch.drafter import DFlashDrafter
from engine.backends.torch.engine import load_pair
from tests.tiny_torch import save_random_pair
from engine.training.checkpoint import load_sequences, save_sequences
from engine.training.draft_trainer import (DraftTrainer, DraftTrainSettings, TrainingError,
                                           block_sparse_mask, default_layer_ids, draft_loss, feature_scale, lr_at,
                                           target_features)
from tests.test_no_pickle import no_unpickling  # noqa: F401  (fixture)

DOCS = ["def add(a, b):\n    return a + b\n" * 6, "class Point:\n    x = 0\n    y = 0\n" * 6,
        "for i in range(10):\n    print(i)\n" * 6]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    target, _ = save_random_pair(tmp_path_factory.mktemp("pair"), hidden=32, layers=3)
    return target


def tiny_settings(**kw):
    base = dict(block_size=4, layers=1, sequences=6, prompt_lengths=(16, 24), response_length=20,
                anchors_per_sequence=3, batch_sequences=2, minutes=None, steps=8, eval_every=4, checkpoint_every=4)
    return DraftTrainSettings(**{**base, **kw})


def test_block_sparse_mask_layout():
    anchors = torch.tensor([[2, 5]])
    m = block_sparse_mask(anchors, ctx_len=8, block=3)[0, 0]
    assert m.shape == (6, 8 + 6)
    # block 0 (anchor 2): context positions 0,1 only; its own 3 slots; nothing of block 1
    assert m[0, :8].tolist() == [True, True] + [False] * 6
    assert m[2, 8:].tolist() == [True] * 3 + [False] * 3
    # block 1 (anchor 5): context 0..4, its own slots only
    assert m[4, :8].tolist() == [True] * 5 + [False] * 3
    assert m[4, 8:].tolist() == [False] * 3 + [True] * 3


def test_schedule_and_layer_choice():
    assert lr_at(0, 100, 1.0, 0.04) == pytest.approx(0.25)
    assert lr_at(4, 100, 1.0, 0.04) == pytest.approx(1.0)
    assert lr_at(100, 100, 1.0, 0.04) == pytest.approx(0.0)
    assert default_layer_ids(6) == [1, 2, 3]
    assert default_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_layer_ids(2) == [0]


def test_tiny_run_trains_saves_and_resumes(tmp_path, target_dir, no_unpickling):
    trainer = DraftTrainer(target_dir, tmp_path / "draft", tmp_path / "work", tiny_settings())
    prompts = [trainer.pair.tokenizer.encode_prompt("def f(x):\n", raw=True)]
    result = trainer.train(DOCS, prompts)
    assert result["steps"] == 8 and result["final_tau"] >= 1.0
    losses = [h["loss"] for h in result["history"] if "loss" in h]
    assert losses and all(x == x for x in losses)  # finite
    pair = load_pair(target_dir, tmp_path / "draft")
    assert pair.block_size == 4
    # a longer run in the same work folder resumes from the checkpoint at step 8
    again = DraftTrainer(target_dir, tmp_path / "draft", tmp_path / "work", tiny_settings(steps=12), overwrite=True)
    logs = []
    again.log = logs.append
    assert again.train(DOCS)["steps"] == 12
    assert any("resumed at step 8" in line for line in logs)
    assert any("reusing 6 regenerated sequences" in line for line in logs)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["draft_checkpoint.safetensors",
                                                                      "draft_data.safetensors"]


def test_interrupted_regeneration_resumes_from_its_partial_file(tmp_path, target_dir, no_unpickling):
    settings = tiny_settings(steps=1, generate_batch=2, prompt_lengths=(16,))
    trainer = DraftTrainer(target_dir, tmp_path / "d", tmp_path / "w", settings)
    full = trainer.data(DOCS)
    (tmp_path / "w" / "draft_data.safetensors").unlink()
    save_sequences(tmp_path / "w" / "draft_data.partial.safetensors", full[:2], trainer.made_from)  # one batch
    logs = []
    again = DraftTrainer(target_dir, tmp_path / "d", tmp_path / "w", settings, log=logs.append)
    assert again.data(DOCS) == full
    assert "reusing 2 answers made earlier to the same prompts; regenerating 4" in logs
    assert not (tmp_path / "w" / "draft_data.partial.safetensors").exists()


def test_a_run_on_more_data_answers_only_the_new_prompts(tmp_path, target_dir, no_unpickling):
    """A second run on a larger set (more passages here; a longer chats file alike) reuses the answers the
    first run made to the prompts both share, from the file set aside, and asks the target only for the rest:
    the same sequences as a run from scratch. Answers made another way (longer responses) are not reused."""
    work = tmp_path / "w"
    first = DraftTrainer(target_dir, tmp_path / "d", work, tiny_settings(sequences=6)).data(DOCS)
    logs = []
    more = DraftTrainer(target_dir, tmp_path / "d", work, tiny_settings(sequences=9), log=logs.append).data(DOCS)
    assert any("set aside as draft_data.other.safetensors" in line for line in logs)
    assert "reusing 6 answers made earlier to the same prompts; regenerating 3" in logs
    assert all(seq in more for seq in first) and len(more) == 9
    scratch = DraftTrainer(target_dir, tmp_path / "d", tmp_path / "w2", tiny_settings(sequences=9)).data(DOCS)
    assert more == scratch
    logs.clear()
    longer = DraftTrainer(target_dir, tmp_path / "d", work, tiny_settings(sequences=9, response_length=24),
                          log=logs.append).data(DOCS)
    assert not any("reusing" in line for line in logs) and all(len(t) == p + 24 for p, t in longer)


def test_a_work_folder_of_other_data_is_set_aside_not_mixed_in(tmp_path, target_dir, no_unpickling):
    """Training again in the same work folder on other documents (train-draft's default folder is OUT.work)
    used to reuse the first run's answers and resume its checkpoint without a word. Now both are set aside and
    the user told; a partial regeneration of other data is not resumed either; the same data is still reused."""
    work = tmp_path / "w"
    DraftTrainer(target_dir, tmp_path / "d", work, tiny_settings(steps=4)).train(DOCS)
    first = load_sequences(work / "draft_data.safetensors")
    logs = []
    other = ["while True:\n    break\n" * 8, "import os\nprint(os.sep)\n" * 8, "x = [1, 2, 3]\n" * 10]
    again = DraftTrainer(target_dir, tmp_path / "d", work, tiny_settings(steps=6), log=logs.append, overwrite=True)
    assert again.train(other)["steps"] == 6
    assert not any("reusing" in line or "resumed" in line for line in logs), logs
    for name in ("draft_data", "draft_checkpoint"):
        assert any(f"{work / name}.safetensors holds" in line and f"set aside as {name}.other.safetensors" in line
                   for line in logs), name
    assert load_sequences(work / "draft_data.other.safetensors") == first
    assert load_sequences(work / "draft_data.safetensors") != first
    # a partial regeneration of the first documents, then a run on the second: not resumed
    (work / "draft_data.safetensors").rename(work / "draft_data.partial.safetensors")
    logs.clear()
    again = DraftTrainer(target_dir, tmp_path / "d", work, tiny_settings(steps=1), log=logs.append, overwrite=True)
    assert again.data(DOCS) == first
    assert not any("resuming regeneration" in line for line in logs)
    assert any("draft_data.partial.safetensors holds answers made from other data" in line for line in logs)
    # the same data and drafter: reused and resumed as before (the first run here sets the other documents'
    # checkpoint aside)
    DraftTrainer(target_dir, tmp_path / "d", work, tiny_settings(steps=8), log=print, overwrite=True).train(DOCS)
    logs.clear()
    again = DraftTrainer(target_dir, tmp_path / "d", work, tiny_settings(steps=10), log=logs.append, overwrite=True)
    assert again.train(DOCS)["steps"] == 10
    assert any("reusing 6 regenerated sequences" in line for line in logs)
    assert any("resumed at step 8" in line for line in logs)
    assert not any("set aside" in line for line in logs)
    # another drafter shape on the same data: the answers reused, the checkpoint set aside
    logs.clear()
    wider = DraftTrainer(target_dir, tmp_path / "d", work, tiny_settings(steps=4, layers=2), log=logs.append,
                         overwrite=True)
    assert wider.train(DOCS)["steps"] == 4 and not any("resumed" in line for line in logs)
    assert any("draft_checkpoint.safetensors holds a checkpoint made from other data" in line for line in logs)


def test_files_of_older_versions_are_reported_never_loaded(tmp_path, target_dir, no_unpickling):
    work = tmp_path / "w"
    work.mkdir()
    old = {name: f"pickled by an older version: {name}".encode()
           for name in ("draft_data.pt", "draft_data.partial.pt", "draft_checkpoint.pt")}
    for name, content in old.items():
        (work / name).write_bytes(content)
    logs = []
    trainer = DraftTrainer(target_dir, tmp_path / "d", work, tiny_settings(steps=1), log=logs.append)
    assert trainer.train(DOCS)["steps"] == 1
    for name, content in old.items():
        assert any(line.startswith(f"found {name} in {work} from an older version: it is not loaded, because "
                                   "reading it would need unpickling") for line in logs), name
        assert (work / name).read_bytes() == content
    assert not any("reusing" in line or "resum" in line for line in logs)


@pytest.mark.parametrize("bf16", [False, True])
def test_training_lowers_the_loss_on_its_data(tmp_path, target_dir, bf16):
    settings = tiny_settings(steps=60, lr=3e-3, checkpoint_every=1000, bf16=bf16)
    trainer = DraftTrainer(target_dir, tmp_path / "d", tmp_path / "w", settings)
    assert trainer.train(DOCS)["bf16"] is bf16
    seqs = trainer.data(DOCS)
    feats = target_features(trainer.pair, seqs)
    group = [i for i, s in enumerate(seqs) if len(s[1]) == len(seqs[0][1])]
    tokens = torch.tensor([seqs[i][1] for i in group])
    f = torch.stack([feats[i] for i in group])
    anchors = torch.arange(seqs[0][0], tokens.shape[1] - 4 + 1).expand(len(group), -1)

    def loss_of(drafter):
        with torch.no_grad():
            return draft_loss(drafter, trainer.pair, tokens, f, anchors, 4.0)[0].item()
    before = loss_of(trainer.make_drafter().eval())            # same seed: the untrained weights
    after = loss_of(DFlashDrafter.from_pretrained(tmp_path / "d"))
    assert after < before - 0.2, f"loss {before:.3f} -> {after:.3f}"


def test_features_for_training_in_bfloat16_come_from_a_bfloat16_copy_close_to_the_float32_ones(tmp_path, target_dir):
    """Where training runs in bfloat16 the target's features come from a bfloat16 copy of it (3.5x faster with
    AMX): close to the float32 ones, and the float32 target itself is left as it was."""
    trainer = DraftTrainer(target_dir, tmp_path / "d", tmp_path / "w", tiny_settings())
    trainer.make_drafter()                                  # captures the drafter's target layers
    seqs = trainer.data(DOCS)
    exact, fast = trainer.features(seqs, bf16=False), trainer.features(seqs, bf16=True)
    assert len(fast) == len(exact) == len(seqs)
    for f, e in zip(fast, exact):
        assert f.shape == e.shape and f.dtype == torch.float16 and not torch.equal(f, e)
        assert ((f.float() - e.float()).norm() / e.float().norm()).item() < 0.03
    assert next(trainer.pair.target.model.parameters()).dtype == torch.float32
    assert trainer.features(seqs, bf16=False)[0].equal(exact[0])


def test_training_on_scaled_features_saves_a_drafter_of_the_raw_ones(tmp_path, target_dir):
    """The trainer divides the features by each channel's RMS and folds that into fc when it saves. A drafter
    continued at a learning rate of nothing comes out as it went in, so the weights it starts from and the
    ones it saves both read the target's own features."""
    first = DraftTrainer(target_dir, tmp_path / "a", tmp_path / "w", tiny_settings(steps=4))
    first.train(DOCS)
    scale = feature_scale(target_features(first.pair, first.data(DOCS)))
    assert not torch.allclose(scale, torch.ones_like(scale), rtol=0.5)     # a change of scale to undo
    again = DraftTrainer(target_dir, tmp_path / "b", tmp_path / "w2",
                         tiny_settings(steps=1, lr=1e-12, init_from=str(tmp_path / "a")))
    again.train(DOCS)
    before = DFlashDrafter.from_pretrained(tmp_path / "a").state_dict()
    after = DFlashDrafter.from_pretrained(tmp_path / "b").state_dict()
    assert before.keys() == after.keys()
    for name in before:
        assert torch.allclose(before[name], after[name], rtol=1e-4, atol=1e-6), name


def test_output_folder_that_exists(tmp_path, target_dir):
    DraftTrainer(target_dir, tmp_path / "d", tmp_path / "w", tiny_settings(steps=1)).train(DOCS)
    with pytest.raises(TrainingError, match="already holds a drafter"):
        DraftTrainer(target_dir, tmp_path / "d", tmp_path / "w2", tiny_settings())


def test_empty_corpus(tmp_path, target_dir):
    trainer = DraftTrainer(target_dir, tmp_path / "d", tmp_path / "w", tiny_settings())
    with pytest.raises(TrainingError, match="corpus is empty"):
        trainer.train(["", "  \n"])


def test_block_larger_than_data(tmp_path, target_dir):
    with pytest.raises(TrainingError, match="block size is larger than the data"):
        DraftTrainer(target_dir, tmp_path / "d", tmp_path / "w", tiny_settings(block_size=32, response_length=20))


def test_documents_too_short(tmp_path, target_dir):
    trainer = DraftTrainer(target_dir, tmp_path / "d", tmp_path / "w", tiny_settings())
    with pytest.raises(TrainingError, match="no document longer than 16 tokens"):
        trainer.train(["x = 1"])


def test_target_the_engine_cannot_adapt(tmp_path):
    bad = tmp_path / "not-a-model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (bad / "model.safetensors").write_bytes(b"")
    with pytest.raises(TrainingError, match="cannot adapt this target"):
        DraftTrainer(bad, tmp_path / "d", tmp_path / "w", tiny_settings())


def test_cli_reports_bad_corpus(tmp_path, target_dir):
    proc = subprocess.run([sys.executable, "-m", "dflash_desktop", "train-draft", "--target", str(target_dir),
                           "--corpus", str(tmp_path / "missing"), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Corpus" in proc.stderr and "does not exist" in proc.stderr


def test_regeneration_saves_every_batch_and_answers_do_not_depend_on_the_others(target_dir):
    """Regeneration hands every batch to save (what an interrupted run reuses), and a prompt's response is
    the same whichever prompts run beside it (so answers made by another run can stand in)."""
    from engine.training.draft_trainer import regenerate
    pair = load_pair(target_dir)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (8, 12, 8, 12, 8)]
    saved = []
    full = regenerate(pair, prompts, 6, batch=2, log=lambda _: None, save=lambda so_far: saved.append(list(so_far)))
    assert [len(s) for s in saved] == [2, 3, 5]          # lengths 8 (x3) in batches of 2, then 12 (x2)
    part = regenerate(pair, prompts[1:4], 6, batch=2, log=lambda _: None)
    assert len(part) == 3 and all(seq in full for seq in part)
    assert all(len(toks) == length + 6 for length, toks in full)


def test_cli_trains_in_the_precision_asked_for(tmp_path, target_dir):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, doc in enumerate(DOCS * 2):
        (corpus / f"f{i}.py").write_text(doc * 4)
    proc = subprocess.run([sys.executable, "-m", "dflash_desktop", "train-draft", "--target", str(target_dir),
                           "--corpus", str(corpus), "--out", str(tmp_path / "o"), "--block-size", "4",
                           "--layers", "1", "--sequences", "4", "--response-length", "16", "--steps", "2",
                           "--precision", "bfloat16", "--answer-vocab"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["bf16"] is True and 0 < result["loss_vocab"] < load_pair(target_dir).target.vocab_rows
    assert load_pair(target_dir, tmp_path / "o").block_size == 4


def test_the_mask_token_is_chosen_from_what_the_chat_never_uses(smollm2_folder):
    """SmolLM2 has no <|mask|>: the trainer takes its last special token that is no BOS/EOS/pad/unk and that
    the chat template never writes (<empty_output>), where it used to stop and ask the user to add one."""
    from transformers import AutoTokenizer

    from tests.tiny_torch import byte_tokenizer
    from engine.training.draft_trainer import choose_mask_token
    smol = AutoTokenizer.from_pretrained(str(smollm2_folder))
    chosen = choose_mask_token(smol, eos_ids=(2,))
    assert smol.convert_ids_to_tokens(chosen) == "<empty_output>"
    assert choose_mask_token(smol, vocab_rows=12) == 11          # within the embedding's rows
    byte = byte_tokenizer()
    assert choose_mask_token(byte) == byte.convert_tokens_to_ids("<|mask|>")
    plain = byte_tokenizer()
    plain.chat_template = "{{ '<|endoftext|>' }}"
    with pytest.raises(TrainingError, match="no special token the chat does not use"):
        choose_mask_token(plain, vocab_rows=257)                  # <|mask|> (257) lies outside the rows


def untrained(target_dir, work: str, shape: tuple[int, int], high: int):
    """A trainer, its untrained drafter, random tokens below `high` of `shape` and the target's features of them."""
    trainer = DraftTrainer(target_dir, target_dir.parent / "unused", target_dir.parent / work, tiny_settings())
    drafter = trainer.make_drafter().eval()                # it also sets which target layers are captured
    tokens = torch.randint(3, high, shape, generator=torch.Generator().manual_seed(3))
    trainer.pair.target.decoder(input_ids=tokens, use_cache=False)
    return trainer, drafter, tokens, trainer.pair.target.captured_features()


def test_padding_after_a_sequence_changes_nothing(target_dir):
    """Chat answers differ in length, so batches are padded on the right: the padded slots have no label and
    the padded context is never attended, so a sequence's loss is the same alone and padded."""
    trainer, drafter, tokens, feats = untrained(target_dir, "w-pad", (1, 20), 200)
    anchors = torch.tensor([[5, 12, 17, 18]])                          # the last blocks run past the end
    padded_tokens = torch.cat([tokens, torch.full((1, 7), -1)], dim=1)
    padded_feats = torch.cat([feats, torch.zeros(1, 7, feats.shape[-1])], dim=1)
    with torch.no_grad():
        alone, acc_alone = draft_loss(drafter, trainer.pair, tokens, feats, anchors, 4.0)
        padded, acc_padded = draft_loss(drafter, trainer.pair, padded_tokens, padded_feats, anchors, 4.0)
    assert padded.item() == pytest.approx(alone.item(), rel=1e-5)
    assert torch.allclose(acc_alone, acc_padded)


def test_the_answer_vocabulary_softmax_is_the_full_one_restricted(target_dir):
    """With every token in it, the restricted softmax is the full one; with fewer, the labels map to their rows."""
    trainer, drafter, tokens, feats = untrained(target_dir, "w-vocab", (2, 20), 60)
    anchors = torch.tensor([[4, 9], [6, 12]])
    rows = trainer.pair.target.vocab_rows
    with torch.no_grad():
        full, _ = draft_loss(drafter, trainer.pair, tokens, feats, anchors, 4.0)
        same, _ = draft_loss(drafter, trainer.pair, tokens, feats, anchors, 4.0, vocab=torch.arange(rows))
        fewer, _ = draft_loss(drafter, trainer.pair, tokens, feats, anchors, 4.0, vocab=torch.arange(60))
    assert same.item() == pytest.approx(full.item(), rel=1e-5)
    assert fewer.item() < full.item()           # the same logits, normalised over fewer tokens


def test_chat_answers_end_with_the_turn_and_do_not_depend_on_the_batch(smollm2_folder):
    """Answers to chat prompts stop at <|im_end|> (kept: the drafter learns to end a turn), and prompts of
    different lengths padded together get the answers each gets alone."""
    from engine.training.draft_trainer import regenerate_chats
    pair = load_pair(smollm2_folder)
    prompts = [pair.tokenizer.encode_chat([{"role": "user", "content": q}])
               for q in ("What is the capital of France?", "Name three colours of the rainbow, please.")]
    together = regenerate_chats(pair, prompts, 40, batch=2, log=lambda _: None)
    alone = [regenerate_chats(pair, [p], 40, batch=1, log=lambda _: None)[0] for p in sorted(prompts, key=len)]
    assert together == alone
    first = next(toks for length, toks in together if toks[:length] == prompts[0])
    answer = first[len(prompts[0]):]
    assert answer[-1] == 2 and 2 not in answer[:-1]
    assert pair.tokenizer.decode(answer).strip() == "The capital of France is Paris."


def test_a_drafter_for_a_real_chat_model_trains_on_a_tiny_budget_and_loads_everywhere(
        tmp_path, smollm2_folder, no_unpickling):
    """The chat pair's recipe on a tiny budget (scripts/build_chat_pair.py --tiny: the target answers a few of
    the project's prompts, a few steps): the drafter records the chosen mask token, loads in torch, and
    llama.cpp's converter carries the token into the DFlash GGUF."""
    out = tmp_path / "chat" / "draft"
    proc = subprocess.run([sys.executable, "scripts/build_chat_pair.py", "--tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recipe = json.loads((out.parent / "RECIPE.json").read_text())
    result = recipe["result"]
    assert result["steps"] == 3 and result["sequences"] >= 5 and result["final_tau"] >= 1.0
    assert recipe["prompts"]["train"] == 6 and "answered 6/6 chat prompts" in proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"][-1] < 29
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"]["mask_token_id"] == 16 and config["block_size"] == 16
    pair = load_pair(smollm2_folder, out)
    assert pair.block_size == 16 and pair.drafter.config.mask_token_id == 16
    from engine import gguf_metadata as metadata
    from engine.backends.llamacpp import build
    try:
        build.find_build()
    except build.BuildMissing:
        return
    from engine.backends.llamacpp import convert
    gguf = convert.draft_gguf(out, smollm2_folder, "float32")
    meta = metadata.read_metadata(gguf)
    assert metadata.architecture(meta) == "dflash" and meta.get("tokenizer.ggml.mask_token_id") == 16


@pytest.mark.parametrize("lines, message", [
    (['[{"role": "user", "content": "Hi"}]', "not json"], "line 2 is not JSON"),
    (['[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi!"}]'], "line 1 is not a conversation"),
    (['{"role": "user", "content": "Hi"}'], "line 1 is not a conversation"),
    (['[{"role": "user", "content": "Hi"}]'], "has no chat template"),      # the random pair's tokenizer has none
])
def test_cli_checks_a_chats_file_before_training(tmp_path, target_dir, lines, message):
    chats = tmp_path / "chats.jsonl"
    chats.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, "-m", "dflash_desktop", "train-draft", "--target", str(target_dir),
                           "--chats", str(chats), "--out", str(tmp_path / "o"), "--steps", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-800:]
    assert not (tmp_path / "o").exists()


def test_fresh_conversations_are_new_training_chats_never_held_out():
    """Training a shipped drafter further (build_chat_pair.py --fresh N) uses chats of the training pools that
    the shipped set does not hold, and never a held-out one; the same N gives the same chats."""
    from scripts import chat_prompts
    train, held = chat_prompts.conversations()
    fresh = chat_prompts.fresh_conversations(300)
    chat_prompts.check(fresh)
    keys = {chat_prompts._key(c) for c in fresh}
    assert len(fresh) == 300 and not keys & {chat_prompts._key(c) for c in train + held}
    assert fresh == chat_prompts.fresh_conversations(300)
    more = chat_prompts.fresh_conversations(4000, draws=2)     # one draw holds about 3,000
    chat_prompts.check(more)
    assert len(more) == 4000 and not {chat_prompts._key(c) for c in more} & {
        chat_prompts._key(c) for c in train + held}
    one = chat_prompts.fresh_conversations(4000)
    assert len(one) < 4000 and more[:len(one)] == one        # a second draw adds to the first, changing nothing
