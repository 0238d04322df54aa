"""The llama.cpp build this engine runs: llama-server and the GGUF converter, from the llama.cpp source
vendored in one pinned llama-cpp-python sdist (a registry package, checked by its hash), built with
cmake once per machine and kept in the user's cache, outside any repository. The project's patches
(patches/ beside this file; patches/<backend>/ for one backend's code only) are applied before the build and
are part of its cache key, so a changed patch rebuilds the builds it touches and no other.

    python -m engine.backends.llamacpp.build              # build when missing (CPU), print where
    python -m engine.backends.llamacpp.build --backend vulkan   # the GPU build for any vendor's Vulkan driver
    python -m engine.backends.llamacpp.build --backend cuda|vulkan|metal --portable   # installers' CI

A GPU build runs on the CPU as well (its CPU backend is built in), so one build is enough where only one ships.

Nothing is downloaded at build time besides the sdist: the web UI, OpenSSL and other fetches are off.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ...errors import EngineError

VERSION = "0.3.36"                     # llama-cpp-python, vendoring llama.cpp 0c1e570 (DFlash drafts)
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PATCHES = Path(__file__).with_name("patches")
HOME_ENV = "DFLASH_LLAMACPP_HOME"      # a folder holding a build
BUNDLED = "llama.cpp"                  # the builds an installed app carries, in its _internal folder (installers/)
BACKENDS = {"cpu": [], "cuda": ["-DGGML_CUDA=ON"], "vulkan": ["-DGGML_VULKAN=ON"], "metal": ["-DGGML_METAL=ON"]}
# What each build is called in messages, and the command that makes it
BACKEND_LABELS = {"cpu": "CPU", "cuda": "CUDA", "vulkan": "Vulkan", "metal": "Metal"}
# Off: the prebuilt web UI and OpenSSL would be fetched or linked; tests, examples and other tools are
# not needed. The server only ever listens on 127.0.0.1 (server.py).
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF"]
# A build that ships in an installer must run on other computers: no -march=native, no OpenMP runtime
# (libgomp, vcomp140.dll) that the user's system may lack (ggml then uses its own thread pool), and on
# Windows the C++ runtime linked in, since llama-server.exe does not see the DLLs beside the app's Python.
PORTABLE_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_OPENMP=OFF", "-DCMAKE_POLICY_DEFAULT_CMP0091=NEW",
                  "-DCMAKE_MSVC_RUNTIME_LIBRARY=MultiThreaded"]
TARGETS = ("llama-server", "llama-bench")
CONVERTER = ("convert_hf_to_gguf.py", "conversion", "gguf-py")
EXE = ".exe" if os.name == "nt" else ""


class BuildMissing(EngineError):
    code = "engine_unavailable"


def patch_files(backend: str = "cpu") -> list[Path]:
    """The patches every build takes, then those for this backend's code alone."""
    return sorted(PATCHES.glob("*.patch")) + sorted((PATCHES / backend).glob("*.patch"))


def key(backend: str = "cpu", portable: bool = False) -> str:
    """Version, backend and the patches' contents: what makes two builds different."""
    digest = hashlib.sha256()
    for p in patch_files(backend):
        digest.update(p.name.encode() + b"\0" + p.read_bytes())
    return f"{VERSION}-{backend}{'-portable' if portable else ''}-{digest.hexdigest()[:10]}"


def cache_root() -> Path:
    """The per-user build cache. Not under DFLASH_DESKTOP_HOME: tests relocate the app's folders, and a
    build is a machine's, not an app profile's."""
    import platformdirs
    return Path(platformdirs.user_cache_dir("DFlashDesktop", appauthor=False)) / "llama.cpp"


def build_dir(backend: str = "cpu", portable: bool = False) -> Path:
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    return cache_root() / key(backend, portable)


def bundled_name(backend: str) -> str:
    """The folder of a build an installed app carries: the CPU build as llama.cpp (with the converter), a GPU
    build beside it as llama.cpp-<backend> (its server only)."""
    return BUNDLED if backend == "cpu" else f"{BUNDLED}-{backend}"


def bundled_dirs() -> list[Path]:
    """The builds inside an installed (frozen) app (none in a source checkout), the CPU one first."""
    base = getattr(sys, "_MEIPASS", None)
    if not (getattr(sys, "frozen", False) and base):
        return []
    return [Path(base) / bundled_name(b) for b in BACKENDS if (Path(base) / bundled_name(b)).is_dir()]


def builds() -> dict[str, Path]:
    """The finished builds for this version and these patches, by backend: DFLASH_LLAMACPP_HOME's alone when
    set, else the one an installed app carries and those in the user's cache."""
    if os.environ.get(HOME_ENV):
        folders = [build_dir()]
    else:
        folders = [build_dir(b, portable) for b in BACKENDS for portable in (False, True)]
        folders[:0] = bundled_dirs()
    found: dict[str, Path] = {}
    for folder in folders:
        try:
            backend = json.loads((folder / "BUILD.json").read_text(encoding="utf-8")).get("backend", "cpu")
        except (OSError, ValueError):
            continue
        found.setdefault(backend, folder)
    return found


def find_build(backend: str = "cpu") -> Path:
    """The build that runs on this backend: its own, or for the CPU any build (a GPU build keeps its layers on
    the CPU when told to)."""
    found = builds()
    if backend in found:
        return found[backend]
    if backend == "cpu" and found:
        return next(iter(found.values()))
    if backend != "cpu":
        raise BuildMissing(
            f"llama.cpp's {BACKEND_LABELS[backend]} build is not on this computer, so llama.cpp cannot use the "
            f"GPU here. Run `python -m engine.backends.llamacpp.build --backend {backend}`, or run on the CPU.")
    raise BuildMissing(
        f"llama.cpp {VERSION} (with this app's patches) is not built on this computer. Run "
        "`python -m engine.backends.llamacpp.build` (scripts/dev.sh does it), or set "
        f"{HOME_ENV} to a folder that holds a build.")


def backend_of(folder: Path) -> str:
    return json.loads((folder / "BUILD.json").read_text(encoding="utf-8")).get("backend", "cpu")


def server_binary(backend: str = "cpu") -> Path:
    return find_build(backend) / "bin" / f"llama-server{EXE}"


def converter() -> Path:
    """The GGUF converter: the same Python files in every build."""
    return find_build() / "convert_hf_to_gguf.py"


def fetch_sdist(into: Path, log) -> Path:
    """The sdist through pip (the registry's ordinary client), checked against the pinned hash."""
    log(f"downloading the llama-cpp-python {VERSION} sdist (llama.cpp's source) ...")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={VERSION}", "-d", str(into)], check=True)
    sdist = into / SDIST
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise EngineError(f"{sdist.name} has sha256 {digest}, not the pinned {SDIST_SHA256}: refusing to build it.")
    return sdist


def extract(sdist: Path, into: Path) -> Path:
    """Only the vendored llama.cpp, with tarfile's data filter (no links out, no absolute paths)."""
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(into, members=members, filter="data")
    return into / prefix


def apply_patches(src: Path, backend: str, log) -> None:
    for p in patch_files(backend):
        log(f"applying {p.name}")
        subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(p)], cwd=src, check=True,
                       stdout=subprocess.DEVNULL)


def build(backend: str = "cpu", portable: bool = False, jobs: int | None = None, log=print) -> Path:
    """Build into the cache unless it is there; returns the build folder."""
    out = build_dir(backend, portable)
    if (out / "BUILD.json").is_file():
        return out
    with tempfile.TemporaryDirectory(prefix="llamacpp-build-") as tmp:
        tmp = Path(tmp)
        src = extract(fetch_sdist(tmp, log), tmp / "src")
        apply_patches(src, backend, log)
        flags = CMAKE_FLAGS + BACKENDS[backend] + (PORTABLE_FLAGS if portable else ["-DGGML_NATIVE=ON"])
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        log(f"configuring ({backend}{', portable' if portable else ''}) ...")
        subprocess.run(["cmake", "-S", str(src), "-B", str(tmp / "build"), *generator, *flags], check=True,
                       stdout=subprocess.DEVNULL)
        log("compiling llama-server (a few minutes) ...")
        subprocess.run(["cmake", "--build", str(tmp / "build"), "--config", "Release", "-j",
                        str(jobs or os.cpu_count() or 2), "--target", *TARGETS], check=True)
        staging = out.with_name(out.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "bin").mkdir(parents=True)
        for name in TARGETS:
            found = next((tmp / "build" / "bin").rglob(f"{name}{EXE}"))
            shutil.copy2(found, staging / "bin" / found.name)
        for name in CONVERTER:
            (shutil.copytree if (src / name).is_dir() else shutil.copy2)(src / name, staging / name)
        (staging / "BUILD.json").write_text(json.dumps({
            "llama_cpp_python": VERSION, "backend": backend, "portable": portable, "cmake_flags": flags,
            "patches": [p.name for p in patch_files(backend)], "machine": platform.machine()}, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(staging, out)
    log(f"llama.cpp built in {out}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=sorted(BACKENDS), default="cpu")
    p.add_argument("--portable", action="store_true",
                   help="no -march=native, no OpenMP runtime, static C++ runtime on Windows (builds that ship)")
    p.add_argument("--jobs", type=int, help="parallel compile jobs (default: every core)")
    args = p.parse_args(argv)
    try:
        build(args.backend, args.portable, args.jobs)
    except (EngineError, subprocess.CalledProcessError, OSError) as exc:
        print(f"error: the llama.cpp build failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
