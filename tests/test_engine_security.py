"""Bad input to the engine, as a hostile model folder or a careless caller would give it (issue 15):
code in a model folder never runs, a chat template cannot hang the worker, configs are checked against
their weights before anything is built, and settings and prompts are refused up front with the limit
named. Each test was seen to fail without the check it covers."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_desktop.worker_client import WorkerClient
from engine import protocol as P
from engine import tokenizer as tok_mod
from engine.backends.torch.engine import load_pair
from tests.tiny_torch import save_random_pair
from engine.errors import CheckpointError, PromptTooLongError

T = 120
LOOPING_TEMPLATE = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
                    "{{ messages[0]['content'] }}")


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    return save_random_pair(tmp_path_factory.mktemp("pair"), block_size=8)


def copy_pair(src_dirs, dest: Path) -> tuple[Path, Path]:
    import shutil
    target, draft = dest / "target", dest / "draft"
    shutil.copytree(src_dirs[0], target)
    shutil.copytree(src_dirs[1], draft)
    return target, draft


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


# -- code in a model folder never runs ---------------------------------------------------------------

def plant_remote_code(target: Path, marker: Path) -> None:
    """A model of a type transformers does not know, whose config and tokenizer point at the folder's own
    Python (auto_map): code that would leave a marker file behind."""
    code = f"open({str(marker)!r}, 'w').write('ran')\n"
    for name in ("evil_model.py", "evil_tokenizer.py"):
        (target / name).write_text(code + "class Evil: pass\n")
    edit_json(target / "config.json", model_type="evil",
              auto_map={"AutoConfig": "evil_model.Evil", "AutoModelForCausalLM": "evil_model.Evil"})
    edit_json(target / "tokenizer_config.json", tokenizer_class="EvilTokenizer",
              auto_map={"AutoTokenizer": ["evil_tokenizer.Evil", None]})


@pytest.mark.parametrize("load", [
    "from engine.backends.torch.target import TargetModel; TargetModel.from_pretrained(folder)",
    "from engine.tokenizer import ChatTokenizer; ChatTokenizer.from_folder(folder)",
], ids=["model", "tokenizer"])
def test_the_loaders_never_run_a_folders_code_even_when_asked_yes(tmp_path, pair_dirs, load):
    """Left unset, trust_remote_code makes transformers ask 'Do you wish to run the custom code? [y/N]'
    on the terminal; answering y ran the folder's file. The loaders pass False, so nobody is asked."""
    target, _ = copy_pair(pair_dirs, tmp_path)
    marker = tmp_path / "ran.txt"
    plant_remote_code(target, marker)
    proc = subprocess.run([sys.executable, "-c", f"folder = {str(target)!r}; {load}"], input="y\ny\n",
                          capture_output=True, text=True, timeout=T)
    assert not marker.exists(), "the folder's code ran"
    assert "Do you wish" not in proc.stdout + proc.stderr
    assert "CheckpointError" in proc.stderr and "code" in proc.stderr


def test_an_unknown_architecture_with_remote_code_is_refused_before_transformers_sees_it(tmp_path, pair_dirs):
    target, draft = copy_pair(pair_dirs, tmp_path)
    marker = tmp_path / "ran.txt"
    plant_remote_code(target, marker)
    edit_json(target / "config.json", model_type="evil")
    with pytest.raises(CheckpointError, match="does not run 'evil' models") as err:
        load_pair(target, draft, device="cpu")
    assert err.value.code == "unsupported_architecture" and not marker.exists()


# -- chat templates ------------------------------------------------------------------------------------

@pytest.fixture
def looping_tokenizer(pair_dirs, monkeypatch):
    monkeypatch.setattr(tok_mod, "TEMPLATE_SECONDS", 0.5)
    tok = tok_mod.ChatTokenizer.from_folder(pair_dirs[0])
    tok.tokenizer.chat_template, tok.has_template = LOOPING_TEMPLATE, True
    return tok


def test_a_template_that_never_ends_is_stopped_at_its_deadline(looping_tokenizer):
    start = time.monotonic()
    with pytest.raises(tok_mod.TemplateError, match="took longer than 0.5 s") as err:
        looping_tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    assert err.value.code == "template_error" and time.monotonic() - start < 30


def test_a_template_stops_when_cancelled(looping_tokenizer):
    with pytest.raises(tok_mod.TemplateError, match="was cancelled"):
        looping_tokenizer.encode_chat([{"role": "user", "content": "hi"}], cancelled=lambda: True)


def test_a_looping_template_leaves_the_worker_serving(tmp_path, pair_dirs):
    """Through a real worker: cancel ends the stuck request promptly, and the next one runs."""
    target, draft = copy_pair(pair_dirs, tmp_path)
    edit_json(target / "tokenizer_config.json", chat_template=LOOPING_TEMPLATE)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    client = WorkerClient()
    try:
        assert client.wait(client.load_pair(target, draft, device="cpu"), T)["event"] == "loaded"
        rid = client.generate(messages=[{"role": "user", "content": "hi"}], settings={"max_new_tokens": 4})
        time.sleep(0.5)
        client.cancel(rid)
        stuck = client.wait(rid, 30)
        assert stuck["code"] == "template_error" and "cancelled" in stuck["message"]
        fine = client.wait(client.generate(prompt="hi", raw=True, settings={"max_new_tokens": 4}), T)
        assert fine["event"] == "done"
    finally:
        client.shutdown(10)


# -- configs are checked against their weights before anything is built ------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"num_hidden_layers": 10**6}, "num_hidden_layers must be a whole number from 1 to 256, got 1000000"),
    ({"hidden_size": None}, "hidden_size must be a whole number"),
    ({"rms_norm_eps": "tiny"}, "rms_norm_eps must be a small positive number"),
    ({"num_hidden_layers": 3}, "num_hidden_layers is 3 but the weights hold 1 layers"),
    ({"intermediate_size": 7}, "has shape"),
])
def test_a_drafter_config_that_cannot_be_right_is_refused_by_name(tmp_path, pair_dirs, changes, message):
    target, draft = copy_pair(pair_dirs, tmp_path)
    edit_json(draft / "config.json", **changes)
    start = time.monotonic()
    with pytest.raises(CheckpointError, match=message) as err:
        load_pair(target, draft, device="cpu")
    assert "config.json" in str(err.value) or "model.safetensors" in str(err.value)
    assert time.monotonic() - start < 60   # a generous bound; 10**6 layers used to grow to 7.7 GB first


@pytest.mark.parametrize("changes, message", [
    ({"num_hidden_layers": 10**6}, "num_hidden_layers must be a whole number from 1 to 1,024, got 1000000"),
    ({"num_hidden_layers": 6}, "says num_hidden_layers 6, but the weights hold 4 decoder layers"),
    ({"hidden_size": 10**9}, "hidden_size must be a whole number"),
    ({"hidden_size": 96}, "says hidden_size 96, but model.embed_tokens.weight in model.safetensors is 64 wide"),
    ({"vocab_size": "many"}, "vocab_size must be a whole number"),
])
def test_a_target_config_that_cannot_be_right_is_refused_by_name(tmp_path, pair_dirs, changes, message):
    target, draft = copy_pair(pair_dirs, tmp_path)
    edit_json(target / "config.json", **changes)
    with pytest.raises(CheckpointError, match=message) as err:
        load_pair(target, draft, device="cpu")
    assert "config.json" in str(err.value)


def test_weights_that_cannot_fit_are_refused_before_loading(pair_dirs):
    from engine.backends.torch.target import TargetModel
    with pytest.raises(CheckpointError, match="needs about .* GB but only 0.0 GB is free") as err:
        TargetModel.from_pretrained(pair_dirs[0], available_bytes=1000)
    assert err.value.code == "out_of_memory"


# -- settings and prompts are refused up front --------------------------------------------------------

@pytest.mark.parametrize("settings, key", [
    ({"temperature": 1e-40}, "temperature"), ({"seed": 2**70}, "seed"), ({"seed": float("nan")}, "seed"),
    ({"top_k": 2.5}, "top_k"), ({"block_size": 2.5}, "block_size"), ({"max_new_tokens": 1.5}, "max_new_tokens"),
    ({"max_new_tokens": True}, "max_new_tokens"), ({"stop_strings": "abc"}, "stop_strings"),
    ({"temperature": "hot"}, "temperature"), ({"warp": 9}, "warp"),
])
def test_settings_the_engine_cannot_run_are_refused_by_the_protocol(settings, key):
    line = json.dumps({"cmd": "generate", "id": "g", "prompt": "x", "settings": settings})   # NaN as JSON does
    with pytest.raises(P.ProtocolError, match=key) as err:
        P.validate_command(P.decode(line))
    assert err.value.code == "bad_settings"


def test_a_huge_prompt_is_refused_before_it_is_tokenised(pair_dirs):
    tok = tok_mod.ChatTokenizer.from_folder(pair_dirs[0])
    with pytest.raises(PromptTooLongError, match="10,000,000 characters"):
        tok.encode_prompt("x" * 10_000_000, raw=True, max_tokens=2048)


@pytest.mark.parametrize("args, message", [
    (["--json", "/no/such/folder/out.json"], "the folder /no/such/folder does not exist"),
    (["--device", "cuda"], "cannot be used"),
    (["--temperature", "1e-40"], "temperature must be 0 (greedy) or from 0.01 to 2"),
])
def test_cli_user_errors_are_sentences_not_tracebacks(pair_dirs, args, message):
    proc = subprocess.run([sys.executable, "-m", "dflash_desktop", "generate", "--target", str(pair_dirs[0]),
                           "--draft", str(pair_dirs[1]), "--prompt", "x", *args],
                          capture_output=True, text=True, timeout=T)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_cli_arguments_that_are_not_text_are_refused(pair_dirs):
    proc = subprocess.run([sys.executable.encode(), b"-m", b"dflash_desktop", b"generate", b"--prompt", b"\xff\xfe",
                           b"--target", str(pair_dirs[0]).encode()], capture_output=True, timeout=T)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2 and "not valid UTF-8" in err and "Traceback" not in err


def test_every_transformers_loader_is_told_never_to_run_folder_code():
    """A source scan: each from_pretrained call of a transformers class passes trust_remote_code=False
    (our own TargetModel and drafter loaders read only JSON and safetensors)."""
    import ast
    from engine.backends.torch.drafter import DFlashDrafter
    from engine.backends.torch.eager import DRAFTERS
    assert all(issubclass(loader, DFlashDrafter) for loader, _ in DRAFTERS.values())
    root = Path(__file__).resolve().parent.parent
    # drafter_class: from DRAFTERS (torch and MLX); MlxDrafter: engine/backends/mlx/drafter.py, safetensors by name;
    # super() in eagle3_config.Loading, a mixin only our EAGLE-3 drafters take, before DFlashDrafter or MlxDrafter
    from engine.eagle3_config import Loading
    assert all(issubclass(c, DFlashDrafter) or c.__name__ == "MlxEagle3" for c in Loading.__subclasses__())
    ours = {"TargetModel", "DFlashDrafter", "DFlash2Drafter", "drafter_class", "MlxDrafter"}
    bad = []
    for folder in ("engine", "dflash_desktop", "ui", "scripts", "bench"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                mixin = (path.name == "eagle3_config.py" and isinstance(node, ast.Call)
                         and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call)
                         and getattr(node.func.value.func, "id", None) == "super")
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "from_pretrained" and not mixin
                        and not (isinstance(node.func.value, ast.Name) and node.func.value.id in ours)):
                    flag = next((k.value for k in node.keywords if k.arg == "trust_remote_code"), None)
                    if not (isinstance(flag, ast.Constant) and flag.value is False):
                        bad.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not bad, f"from_pretrained without trust_remote_code=False: {bad}"
