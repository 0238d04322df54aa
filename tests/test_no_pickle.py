"""The app never unpickles, not even its own files (issue 15): no unpickling call in the code it ships
or runs, and training files that round-trip without one (engine/training/checkpoint.py)."""
import ast
import pickle
from pathlib import Path

import pytest
import torch

from engine.training import checkpoint
from engine.training.checkpoint import (TrainingFileError, load_checkpoint, load_sequences, restore_training,
                                        save_checkpoint, save_sequences, training_checkpoint)

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("engine", "dflash_desktop", "ui", "scripts", "bench")
# modules that unpickle, and calls that do (torch.jit.load also runs the archive's code)
FORBIDDEN = ("pickle", "_pickle", "cPickle", "cloudpickle", "dill", "joblib", "shelve", "torch.load",
             "torch.serialization", "torch.jit.load", "pandas.read_pickle", "pd.read_pickle")


def dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def unpickling(source: str) -> set[tuple[int, str]]:
    """(line, name) of each import, attribute or argument in `source` that unpickles."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            names = [dotted(node)]
        elif isinstance(node, ast.Call):
            names = ["allow_pickle=True" for k in node.keywords
                     if k.arg == "allow_pickle" and not (isinstance(k.value, ast.Constant) and not k.value.value)]
        else:
            continue
        found |= {(node.lineno, n) for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)
                  or n == "allow_pickle=True"}
    return found


@pytest.fixture
def no_unpickling(monkeypatch):
    """Fails the test on any call of torch.load or pickle's loaders while it runs."""
    def refuse(*args, **kwargs):
        raise AssertionError("something was unpickled")
    for owner, name in ((torch, "load"), (torch.serialization, "load"), (pickle, "load"), (pickle, "loads")):
        monkeypatch.setattr(owner, name, refuse)


def test_no_unpickling_in_the_code():
    found = [f"{path.relative_to(REPO)}:{line}: {name}"
             for folder in SCANNED for path in sorted((REPO / folder).rglob("*.py"))
             for line, name in sorted(unpickling(path.read_text(encoding="utf-8")))]
    assert not found, "the app must never unpickle:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    "import torch\nx = torch.load(p)", "import torch\nx = torch.load(p, weights_only=True)",
    "from torch import load", "import pickle", "from pickle import loads", "import _pickle as p",
    "import torch\ntorch.serialization.load(f)", "from torch.serialization import load",
    "import numpy as np\nnp.load(p, allow_pickle=True)", "import pandas as pd\npd.read_pickle(p)",
    "import torch\ntorch.jit.load(p)", "import joblib",
])
def test_the_scan_finds_each_way_to_unpickle(source):
    assert unpickling(source)


def test_the_scan_leaves_safe_loaders_alone():
    assert not unpickling("import json, numpy as np\nfrom safetensors.torch import load_file\n"
                          "json.load(f)\nnp.load(p)\nnp.load(p, allow_pickle=False)\n'torch.load in a string'")


def tiny_model_and_optimizer():
    """Tied weights (like the demo target) and two param groups (decay / no decay), as the trainers use."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 10))
    model[2].weight = model[0].weight
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.95))
    return model, opt


def step(model, opt, seed: int) -> float:
    ids = torch.randint(10, (8,), generator=torch.Generator().manual_seed(seed))
    loss = torch.nn.functional.cross_entropy(model(ids), ids.roll(1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def test_a_resumed_model_and_optimizer_take_exactly_the_same_steps(tmp_path, no_unpickling):
    model, opt = tiny_model_and_optimizer()
    for seed in range(3):
        step(model, opt, seed)
    tensors, meta = training_checkpoint(model, opt)
    save_checkpoint(tmp_path / "ckpt.safetensors", tensors, {**meta, "state": {"step": 3, "history": [1.5]}})
    going_on = [step(model, opt, seed) for seed in (3, 4)]

    resumed, resumed_opt = tiny_model_and_optimizer()
    tensors, meta = load_checkpoint(tmp_path / "ckpt.safetensors")
    restore_training(tensors, meta, resumed, resumed_opt)
    assert meta["state"] == {"step": 3, "history": [1.5]}
    assert [step(resumed, resumed_opt, seed) for seed in (3, 4)] == going_on
    for (name, a), (_, b) in zip(model.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    assert resumed[2].weight is resumed[0].weight            # still tied
    saved, again = opt.state_dict(), resumed_opt.state_dict()
    assert saved["state"].keys() == again["state"].keys()
    for param, values in saved["state"].items():
        for key, value in values.items():
            assert torch.equal(value, again["state"][param][key]), (param, key)
    assert [g["weight_decay"] for g in again["param_groups"]] == [0.1, 0.0]


def test_an_interrupted_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, {"w": torch.ones(3)}, {"step": 1})

    def interrupted(tensors, filename, metadata):
        Path(filename).write_bytes(b"half a checkp")
        raise KeyboardInterrupt
    monkeypatch.setattr(checkpoint, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"w": torch.zeros(3)}, {"step": 2})
    tensors, meta = load_checkpoint(path)
    assert meta == {"step": 1} and torch.equal(tensors["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_sequences_round_trip(tmp_path):
    seqs = [(3, [5, 6, 7, 8, 9]), (2, [1, 2, 3]), (4, [0, 4, 4, 4, 4, 7, 100_000])]
    save_sequences(tmp_path / "data.safetensors", seqs)
    assert load_sequences(tmp_path / "data.safetensors") == seqs
    save_sequences(tmp_path / "empty.safetensors", [])
    assert load_sequences(tmp_path / "empty.safetensors") == []


def test_damaged_or_foreign_files_are_clear_errors(tmp_path):
    (tmp_path / "old.pt").write_bytes(pickle.dumps({"seqs": []}))
    with pytest.raises(TrainingFileError, match="old.pt is damaged or was not written by this version"):
        load_sequences(tmp_path / "old.pt")
    save_checkpoint(tmp_path / "ckpt.safetensors", {"w": torch.ones(2)}, {})
    with pytest.raises(TrainingFileError, match="does not hold regenerated sequences"):
        load_sequences(tmp_path / "ckpt.safetensors")
