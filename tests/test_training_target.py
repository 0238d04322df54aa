"""Demo-pair recipe, stages 1-2: corpus selection and split, tokenizer, target training (tiny run)."""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from scripts.demo_pair import corpus as corpus_mod
from scripts.demo_pair import target_lm
from scripts.demo_pair import tokenizer as tok_mod
from tests.test_no_pickle import no_unpickling  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parent.parent


def _load_script():
    spec = importlib.util.spec_from_file_location("build_demo_pair", REPO / "scripts" / "build_demo_pair.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def script():
    return _load_script()


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------------- corpus


def test_stdlib_corpus_split_is_deterministic_and_disjoint():
    a = corpus_mod.build_corpus()
    b = corpus_mod.build_corpus()
    assert a.train_files == b.train_files and a.held_out_files == b.held_out_files
    train, held = set(a.train_files), set(a.held_out_files)
    assert not train & held
    assert len(held) >= corpus_mod.DEFAULT_MIN_HELD_OUT
    assert len(held) <= 0.1 * (len(train) + len(held))
    assert len(train) > 300  # the whole stdlib, not a sample
    for f in a.all_files:
        parts = f.split("/")
        assert f.endswith(".py")
        assert not {"test", "tests", "idle_test", "site-packages"} & set(parts[:-1]), f
    assert "pydoc_data/topics.py" not in a.all_files
    assert "encodings/cp1252.py" not in a.all_files  # generated charmap table
    assert "encodings/utf_8.py" in a.all_files  # a real codec module stays
    assert "ast.py" in a.all_files
    desc = a.describe()
    assert desc["python_version"] == corpus_mod.python_version()
    assert "PSF" in desc["license"]
    assert desc["held_out_files"] == a.held_out_files


def test_split_depends_only_on_the_paths():
    files = [f"pkg/mod_{i}.py" for i in range(100)]
    train, held = corpus_mod.split_files(files, held_out_fraction=0.05, min_held_out=10)
    train2, held2 = corpus_mod.split_files(list(reversed(files)), held_out_fraction=0.05, min_held_out=10)
    assert (train, held) == (train2, held2)
    assert len(held) == 10 and not set(train) & set(held) and sorted(train + held) == sorted(files)
    # A file's membership does not depend on the directory it was listed from, only its path.
    _, held_more = corpus_mod.split_files(files + ["pkg/extra.py"], held_out_fraction=0.05, min_held_out=10)
    assert len(set(held) & set(held_more)) >= 9


def test_selection_rules(tmp_path):
    root = tmp_path / "lib"
    for rel, text in {
        "a.py": "x = 1\n",
        "pkg/__init__.py": "",  # empty: skipped
        "pkg/b.py": "def f():\n    return 2\n",
        "test/test_a.py": "assert True\n",
        "pkg/tests/t.py": "assert True\n",
        "idlelib/idle_test/t.py": "assert True\n",
        "site-packages/third/x.py": "y = 2\n",
        "config-3.11-x86_64-linux-gnu/python-config.py": "z = 3\n",
        "_sysconfigdata__linux.py": "build_time_vars = {}\n",
        "notes.txt": "not python\n",
    }.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    assert corpus_mod.list_source_files(root) == ["a.py", "pkg/b.py"]


def test_empty_corpus_is_a_clear_error(tmp_path, script, capsys):
    empty = tmp_path / "empty"
    (empty / "test").mkdir(parents=True)
    (empty / "test" / "test_only.py").write_text("assert True\n")
    with pytest.raises(corpus_mod.CorpusError, match="empty corpus"):
        corpus_mod.build_corpus(empty)
    rc = script.main(["--tiny", "--out", str(tmp_path / "out"), "--corpus-root", str(empty)])
    assert rc == 2
    assert "empty corpus" in capsys.readouterr().err
    with pytest.raises(corpus_mod.CorpusError, match="not a directory"):
        corpus_mod.build_corpus(tmp_path / "missing")


# ------------------------------------------------------------------------------------- schedule


def test_schedule_warms_up_then_decays_to_the_floor():
    cfg = target_lm.TrainConfig(lr=1e-3, min_lr_ratio=0.1, warmup_steps=4)
    assert [round(target_lm.lr_at(cfg, s, 0.0), 6) for s in range(4)] == [2.5e-4, 5e-4, 7.5e-4, 1e-3]
    assert target_lm.lr_at(cfg, 10, 0.0) == pytest.approx(1e-3)
    assert target_lm.lr_at(cfg, 10, 0.5) == pytest.approx(5.5e-4)
    assert target_lm.lr_at(cfg, 10, 1.0) == pytest.approx(1e-4)


def test_progress_is_monotone_and_ends_at_one_after_a_replan():
    p, total, seen = 0.0, 20, []
    for step in range(40):
        if step >= total:
            break
        if step == 10:
            total = 30  # the machine got faster: more steps fit in the budget
        p = target_lm.advance_progress(p, step, total, warmup_steps=2)
        seen.append(p)
    assert seen == sorted(seen)
    assert seen[-1] == 1.0 and len(seen) == 30
    # Without re-plans progress is the plain fraction of the post-warm-up steps.
    p = 0.0
    for step in range(10):
        p = target_lm.advance_progress(p, step, 10, warmup_steps=0)
        assert p == pytest.approx((step + 1) / 10)


# ------------------------------------------------------------------------------------- training


def _tiny_setup(vocab=64):
    rng = np.random.default_rng(0)
    # A learnable stream: a repeating pattern with some noise.
    base = np.tile(np.arange(3, 3 + 20, dtype=np.uint16), 200)
    noise = rng.integers(3, vocab, size=base.shape).astype(np.uint16)
    ids = np.where(rng.random(base.shape) < 0.1, noise, base)
    model_cfg = target_lm.TargetModelConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, head_dim=16, num_key_value_heads=1
    )
    train_cfg = target_lm.TrainConfig(
        seq_len=32, batch_size=4, warmup_steps=2, budget_s=60, max_steps=8, measure_after=1,
        measure_steps=2, eval_every=4, eval_max_windows=4, checkpoint_every_s=0.0, log_every=1,
        replan_every=2, num_threads=1, adaptive_threads=False, seed=7,
    )
    return ids[:3000], ids[3000:], model_cfg, train_cfg


def test_resume_after_interruption_matches_an_uninterrupted_run(tmp_path, keep_threads, no_unpickling):
    train, held, model_cfg, cfg = _tiny_setup()
    ref, ref_summary = target_lm.train_target(train, held, model_cfg, cfg, tmp_path / "ref", log=lambda m: None)
    assert ref_summary["steps"] == 8 and math.isfinite(ref_summary["held_out_loss"])

    class Interrupt(Exception):
        pass

    def interrupting_log(msg):
        if "checkpoint saved at step 5" in msg:
            raise Interrupt

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "target_checkpoint.pt").write_bytes(b"pickled by an older version")
    with pytest.raises(Interrupt):
        target_lm.train_target(train, held, model_cfg, cfg, tmp_path / "run", log=interrupting_log)
    msgs = []
    resumed, summary = target_lm.train_target(train, held, model_cfg, cfg, tmp_path / "run", log=msgs.append)
    assert any("resumed" in m and "step 5" in m for m in msgs)
    assert any(m.startswith("found target_checkpoint.pt") and "not loaded" in m for m in msgs)
    assert summary["resumed"] == 1 and summary["steps"] == 8
    for (name, a), (_, b) in zip(ref.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name  # exactly: the checkpoint holds all the state

    # Other settings with the same work dir are refused rather than silently mixed.
    other = target_lm.TrainConfig(**{**cfg.__dict__, "lr": 5e-4})
    with pytest.raises(RuntimeError, match="other settings"):
        target_lm.train_target(train, held, model_cfg, other, tmp_path / "run", log=lambda m: None)


def test_packed_batches_are_a_function_of_the_step():
    ids = np.arange(1000, dtype=np.uint16)
    a = target_lm.PackedBatches(ids, seq_len=16, batch_size=4, seed=3)
    b = target_lm.PackedBatches(ids, seq_len=16, batch_size=4, seed=3)
    for step in (0, 5, 17, 3):  # any order, e.g. after a resume
        assert torch.equal(a.batch(step), b.batch(step))
    x = a.batch(2)
    assert x.shape == (4, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(4, 15, dtype=torch.int64))  # contiguous windows
    with pytest.raises(ValueError, match="too few"):
        target_lm.PackedBatches(ids[:10], seq_len=16, batch_size=4, seed=3)


# ------------------------------------------------------------------------------------- tiny recipe


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory, script):
    out = tmp_path_factory.mktemp("demo") / "tiny"
    n = torch.get_num_threads()
    try:
        rc = script.main(["--tiny", "--out", str(out), "--stage", "tokenizer", "--stage", "target"])
    finally:
        torch.set_num_threads(n)
    assert rc == 0
    return out


def test_tiny_recipe_builds_a_loadable_target(tiny_build):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = tiny_build / "target"
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (target / name).is_file(), name
    recipe = json.loads((tiny_build / "RECIPE.json").read_text())
    tok_stage, tgt_stage = recipe["stages"]["tokenizer"], recipe["stages"]["target"]
    assert recipe["tiny"] is True and recipe["seed"] == 1234
    assert recipe["corpus"]["python_version"] == corpus_mod.python_version()
    assert recipe["corpus"]["held_out_files"]
    assert math.isfinite(tgt_stage["held_out_loss"]) and tgt_stage["steps"] > 0
    assert tgt_stage["mask_token_id"] == tok_stage["mask_token_id"]

    tok = AutoTokenizer.from_pretrained(str(target))
    assert tok.eos_token == tok_mod.EOS_TOKEN and tok.pad_token == tok_mod.PAD_TOKEN
    assert tok.convert_tokens_to_ids(tok_mod.MASK_TOKEN) == tok_stage["mask_token_id"]
    assert tok.mask_token_id == tok_stage["mask_token_id"]
    text = "def add(a, b):\n    return a + b\n"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: lossless round trip

    model = AutoModelForCausalLM.from_pretrained(str(target))
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.tie_word_embeddings and model.config.vocab_size == len(tok)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.config.eos_token_id == tok.eos_token_id
    enc = tok("import os\n", return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == enc["input_ids"].shape[1] + 5 or out[0, -1].item() == tok.eos_token_id


def test_existing_output_directory_is_refused(tiny_build, script, capsys):
    before = (tiny_build / "target" / "model.safetensors").read_bytes()
    rc = script.main(["--tiny", "--out", str(tiny_build), "--stage", "target"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "--overwrite" in err
    assert (tiny_build / "target" / "model.safetensors").read_bytes() == before
    rc = script.main(["--tiny", "--out", str(tiny_build), "--stage", "tokenizer"])
    assert rc == 2 and "already exists" in capsys.readouterr().err


def test_target_stage_needs_the_tokenizer(tmp_path, script, capsys):
    rc = script.main(["--tiny", "--out", str(tmp_path / "fresh"), "--stage", "target"])
    assert rc == 2
    assert "--stage tokenizer" in capsys.readouterr().err


def test_cpu_governor_drops_to_one_thread_under_load_and_waits_before_going_back(keep_threads):
    class Fake(target_lm.CpuGovernor):
        loads: list = []

        def others_load(self):
            return self.loads.pop(0)

    msgs = []
    g = Fake(2, True, msgs.append)
    g.adaptive, g.min_interval_s, g._last = True, 0.0, (0.0, 0.0, 0.0)
    g.loads = [1.0, 0.0, 0.0]
    g.up_delay_s = 3600.0
    assert g.update() and g.threads == 1 and torch.get_num_threads() == 1
    assert not g.update() and g.threads == 1  # one quiet reading is not enough
    g.up_delay_s = 0.0
    assert g.update() and g.threads == 2 and g.switches == 2
    assert not target_lm.CpuGovernor(2, False, msgs.append).update()  # fixed thread count


def test_isolated_newlines_keep_prompt_tokens_a_prefix_of_the_text():
    texts = ["def f(x):\n    if x:\n        return x\n    return 0\n\n\nclass A:\n    pass\n"] * 50
    tok = tok_mod.train_bpe(texts, vocab_size=300, isolate_newlines=True)
    full = "def g(y):\n    return y\n"
    for cut in range(1, len(full)):
        if full[cut - 1] == "\n":  # a prompt that stops at a line break
            assert tok.encode(full).ids[: len(tok.encode(full[:cut]).ids)] == tok.encode(full[:cut]).ids
    assert tok.decode(tok.encode(full).ids) == full
