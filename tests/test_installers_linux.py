"""The Linux installers, built and used here as a user uses them: installers/build.py makes the frozen app,
which opens its window under Xvfb, loads the demo pair and answers a prompt through its own frozen worker
(`--self-test`), while its window process never maps an engine library; then the .tar.gz and the .deb are
made, held to their size budgets, and the .deb is installed, run and removed with the package manager.

Slow (a PyInstaller build: minutes), so the regular suite skips it; `.ci/installers` and the installers
workflow run it with DFLASH_INSTALLER_TESTS=1 (README, "Installers").
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from installers import build, sizes
from ui.self_test import heavy_libraries, mapped_files

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(5400),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux installers"),
              pytest.mark.skipif(os.environ.get("DFLASH_INSTALLER_TESTS") != "1",
                                 reason="builds the installers (minutes): run .ci/installers")]
EXE = build.executable()


def as_root(*command: str) -> list[str]:
    return list(command) if os.geteuid() == 0 else ["sudo", "-n", *command]


@pytest.fixture(scope="module")
def app() -> Path:
    """The build script, run as CI runs it; fails the module if it does not produce the app."""
    started = time.monotonic()
    subprocess.run([sys.executable, str(ROOT / "installers" / "build.py")], cwd=ROOT, check=True, timeout=5000)
    print(f"build took {time.monotonic() - started:.0f} s (load average {os.getloadavg()})")
    assert EXE.is_file() and os.access(EXE, os.X_OK), f"the build made no executable {EXE}"
    return build.APP_DIR


@pytest.fixture(scope="module")
def display():
    """A virtual X screen for the window (Qt's xcb plugin, as on a desktop)."""
    read_fd, write_fd = os.pipe()
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write_fd), "-screen", "0", "1280x860x24", "-nolisten", "tcp"],
                            pass_fds=(write_fd,), stderr=subprocess.DEVNULL)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        number = pipe.readline().strip()
    assert number, "Xvfb did not start"
    yield f":{number}"
    xvfb.terminate()
    xvfb.wait(10)


def self_test(exe: Path, display: str) -> tuple[dict, set[str], set[str]]:
    """Run `exe --self-test` on the display; meanwhile read the memory maps of the window process and of
    its children (the worker) from /proc. Returns the report, and the engine libraries each mapped."""
    import psutil
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "PYTHONPATH")}
    proc = subprocess.Popen([str(exe), "--self-test", "--timeout", "1500"], env={**env, "DISPLAY": display},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    gui_heavy: set[str] = set()
    worker_heavy: set[str] = set()
    while proc.poll() is None:
        try:
            gui_heavy.update(heavy_libraries(mapped_files(proc.pid)))
            for child in psutil.Process(proc.pid).children(recursive=True):
                worker_heavy.update(heavy_libraries(mapped_files(child.pid)))
        except (OSError, psutil.Error):
            pass  # a process ended between two reads
        time.sleep(0.5)
    out, err = proc.communicate()
    assert proc.returncode == 0, f"self-test failed ({proc.returncode}):\n{out}\n{err[-3000:]}"
    return json.loads(out[out.index("{"):]), gui_heavy, worker_heavy


def test_bundle_keeps_what_the_app_needs_and_drops_the_rest(app):
    internal = app / "_internal"
    shm = internal / "torch" / "bin" / "torch_shm_manager"
    assert shm.is_file() and os.access(shm, os.X_OK), "torch starts torch_shm_manager to share tensors"
    assert (internal / "assets" / "demo" / "target" / "model.safetensors").is_file()
    assert (internal / "assets" / "icons" / "dflash.svg").is_file()
    # the metadata of whichever install the build saw (a wheel's dist-info, or an editable checkout's egg-info)
    metadata = [*internal.glob("dflash_desktop-*.dist-info/METADATA"), *internal.glob("dflash_desktop*.egg-info/PKG-INFO")]
    assert metadata, "package metadata: the app's version"
    assert f"Version: {build.version()}" in metadata[0].read_text().splitlines()
    assert (internal / "PySide6" / "Qt" / "plugins" / "platforms" / "libqxcb.so").is_file()
    for gone in ("torch/test", "torch/include", "PySide6/Qt/translations",
                 "PySide6/Qt/plugins/platformthemes/libqgtk3.so", "scipy", "IPython"):
        assert not (internal / gone).exists(), f"{gone} should be trimmed"
    server = internal / "llama.cpp" / "bin" / "llama-server"
    assert server.is_file() and os.access(server, os.X_OK), "the llama.cpp engine runs llama-server"
    assert (internal / "llama.cpp" / "convert_hf_to_gguf.py").is_file()
    assert (internal / "llama.cpp" / "gguf-py" / "gguf" / "__init__.py").is_file()
    assert json.loads((internal / "llama.cpp" / "BUILD.json").read_text())["portable"], "a build made to ship"
    assert not (internal / "llama.cpp" / "bin" / "llama-bench").exists()
    leaks = [p.name for p in internal.rglob("*") if p.name.startswith(("libcuda", "libcudnn", "libgtk-3", "libgdk-3"))]
    assert not leaks, f"build-host libraries in the bundle: {leaks}"


def test_version(app):
    out = subprocess.run([str(EXE), "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == f"dflash-desktop {build.version()}"


def test_cli_command_runs_in_the_frozen_app(app):
    """The engine's commands work from the executable: the demo pair, greedy, a few tokens."""
    run = subprocess.run([str(EXE), "generate", "--engine", "torch", "--prompt", "import os\n", "--raw",
                          "--max-new-tokens", "16"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "tok/s" in run.stdout + run.stderr


def test_llama_cpp_engine_runs_in_the_frozen_app(app, tmp_path):
    """The demo pair through the shipped llama.cpp: converted to GGUF by `<app> --convert-gguf` (the frozen
    converter and its imports), then served by the bundled llama-server; no build in the user's cache."""
    env = {**os.environ, "DFLASH_DESKTOP_HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("DFLASH_LLAMACPP_HOME", None)
    run = subprocess.run([str(EXE), "generate", "--engine", "llamacpp", "--prompt", "import os\n", "--raw",
                          "--max-new-tokens", "16"], capture_output=True, text=True, timeout=1200, env=env)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "tok/s" in run.stdout + run.stderr
    assert list((tmp_path / "home" / "cache" / "gguf").glob("*.gguf")), "the converter wrote the GGUF files"


def test_the_frozen_app_carries_the_vulkan_build_and_falls_back_without_a_gpu(app, tmp_path):
    """The Vulkan llama-server ships beside the CPU build; asked for the GPU on a computer whose Vulkan driver
    offers none (a CI runner), the answer still comes, from the CPU build, saying why."""
    assert (app / "_internal" / "llama.cpp-vulkan" / "bin" / "llama-server").is_file()
    env = {**os.environ, "DFLASH_DESKTOP_HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("DFLASH_LLAMACPP_HOME", None)
    env.pop("GGML_VK_VISIBLE_DEVICES", None)
    run = subprocess.run([str(EXE), "generate", "--engine", "llamacpp", "--device", "vulkan", "--prompt",
                          "import os\n", "--raw", "--max-new-tokens", "8"], capture_output=True, text=True,
                         timeout=1200, env=env)
    said = run.stdout + run.stderr
    assert run.returncode == 0 and "tok/s" in said, said[-3000:]
    assert "Running on the CPU instead" in said, said[-3000:]


def test_the_local_server_answers_from_the_frozen_app(app, tmp_path):
    """`serve` in the frozen app: starlette and uvicorn are bundled and answer on 127.0.0.1."""
    import socket
    import urllib.request
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "DFLASH_DESKTOP_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([str(EXE), "serve", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        body = None
        for _ in range(600):
            if proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as response:
                    body = json.loads(response.read())
                break
            except OSError:
                time.sleep(1)
        assert body and body.get("data"), proc.stdout.read() if proc.poll() is not None else "no answer"
    finally:
        proc.terminate()
        proc.wait(30)


def test_every_claimed_architecture_runs_in_the_frozen_worker(app, tmp_path):
    """transformers imports model code by name, which PyInstaller cannot follow; the spec bundles the
    families the engines claim and trims the other models. Each family, as a tiny random pair written
    from source, must load and decode in the frozen worker."""
    from dflash_desktop.worker_client import WorkerClient
    from tests.tiny_torch import VARIANTS, save_random_pair
    client = WorkerClient(command=[str(EXE), "--worker"],
                          env={**os.environ, "DFLASH_DESKTOP_HOME": str(tmp_path / "home")})
    failed = {}
    try:
        for variant in VARIANTS:
            target, draft = save_random_pair(tmp_path / variant, arch=variant, layers=6)
            loaded = client.wait(client.load_pair(target, draft, device="cpu"), 600)
            done = client.wait(client.generate(prompt="ab", raw=True, settings={"max_new_tokens": 4}), 600) \
                if loaded["event"] == "loaded" else loaded
            if done["event"] != "done":
                failed[variant] = done.get("message")
    finally:
        client.shutdown(10)
    assert not failed, failed


def test_self_test_window_and_frozen_worker(app, display):
    report, gui_heavy, worker_heavy = self_test(EXE, display)
    assert report["ok"] and report["frozen"] and report["steps"][0]["platform"] == "xcb"
    assert report["worker_command"] == [str(EXE), "--worker"], "the worker is the frozen app itself"
    assert not gui_heavy, f"the window process mapped engine libraries: {sorted(gui_heavy)}"
    # the same check sees torch in the worker (the demo pair's tokenizer loads it): it would see it in the window too
    assert any("libtorch" in name for name in worker_heavy), f"no libtorch seen in the worker: {worker_heavy}"


def test_sizes_within_budget(packages):
    rows = {name: (mib, budget) for name, mib, budget in sizes.measure()}
    print("\n".join(f"{name}: {mib:.0f} MiB (budget {budget})" for name, (mib, budget) in rows.items()))
    assert {p.name for p in packages.values()} | {"dflash-desktop"} <= set(rows)
    over = {name: mib for name, (mib, budget) in rows.items() if mib > budget}
    assert not over, f"over budget (a broken trim?): {over}"


@pytest.fixture(scope="module")
def packages(app) -> dict[str, Path]:
    subprocess.run([sys.executable, str(ROOT / "installers" / "linux" / "make_packages.py")], check=True,
                   timeout=3000)
    version = build.version()
    return {"deb": build.DIST / f"dflash-desktop_{version}_amd64.deb",
            "tar": build.DIST / f"dflash-desktop-{version}-linux-x86_64.tar.gz"}


def test_tarball_unpacks_to_a_runnable_app(packages, tmp_path):
    with tarfile.open(packages["tar"]) as tar:
        tar.extractall(tmp_path, filter="tar")
    exe = tmp_path / "dflash-desktop" / "dflash-desktop"
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == f"dflash-desktop {build.version()}"
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "XDG_DATA_HOME": ""}
    subprocess.run([str(tmp_path / "dflash-desktop" / "add-to-menu.sh")], env=env, check=True, timeout=30)
    entry = (home / ".local" / "share" / "applications" / "dflash-desktop.desktop").read_text()
    assert f'Exec="{exe}"' in entry
    subprocess.run([str(tmp_path / "dflash-desktop" / "add-to-menu.sh"), "--remove"], env=env, check=True)
    assert not (home / ".local" / "share" / "applications" / "dflash-desktop.desktop").exists()


def test_deb_installs_runs_and_uninstalls(packages, display):
    if subprocess.run(as_root("true"), capture_output=True).returncode != 0:
        pytest.skip("installing a .deb needs root or passwordless sudo")
    if subprocess.run(["dpkg", "-s", "dflash-desktop"], capture_output=True).returncode == 0:
        pytest.skip("dflash-desktop is already installed on this machine; not touching it")
    fields = subprocess.run(["dpkg-deb", "-f", str(packages["deb"]), "Package", "Version", "Depends"],
                            capture_output=True, text=True, check=True).stdout
    assert f"Version: {build.version()}" in fields and "libxcb-cursor0" in fields
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(as_root("apt-get", "install", "-y", "-q", str(packages["deb"])), env=env, check=True, timeout=900)
    try:
        installed = Path("/opt/dflash-desktop/dflash-desktop")
        command = Path("/usr/bin/dflash-desktop")      # on PATH for users (a developer's PATH may list another)
        assert command.resolve() == installed.resolve() and os.access(command, os.X_OK)
        entry = Path("/usr/share/applications/dflash-desktop.desktop").read_text()
        assert "Exec=/opt/dflash-desktop/dflash-desktop" in entry and "Icon=dflash-desktop" in entry
        assert Path("/usr/share/icons/hicolor/256x256/apps/dflash-desktop.png").is_file()
        if shutil.which("desktop-file-validate"):
            subprocess.run(["desktop-file-validate", "/usr/share/applications/dflash-desktop.desktop"], check=True)
        out = subprocess.run([str(command), "--version"], capture_output=True, text=True, check=True).stdout
        assert out.strip() == f"dflash-desktop {build.version()}"
        report, gui_heavy, _ = self_test(installed, display)
        assert report["ok"] and report["worker_command"] == [str(installed), "--worker"] and not gui_heavy
    finally:
        subprocess.run(as_root("apt-get", "remove", "-y", "-q", "dflash-desktop"), env=env, check=True, timeout=600)
    for path in ("/opt/dflash-desktop", "/usr/bin/dflash-desktop", "/usr/share/applications/dflash-desktop.desktop"):
        assert not os.path.lexists(path), f"left after uninstall: {path}"
