#!/usr/bin/env bash
# Every check of the CUDA path that needs an NVIDIA GPU, as one command for a lent device (the device tool's
# `run`, whose machine has python3 with CUDA torch, Triton and accelerate, but an older transformers and no
# bitsandbytes). Here, once, carry the two as wheels, trimmed: the working tree travels too, and all of it must stay
# under the tool's 64 MiB (the tree 52.5 MiB on 2026-12-07; whole wheels 6.8 + 12.7 MiB would not fit). bitsandbytes
# keeps its CPU and CUDA 13 libraries (6.8 MiB), transformers the model families the checks build (2.5 MiB; with
# it the three test files passed here on the CPU, 2026-12-07):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_24_x86_64 \
#       -d .whl transformers==5.23.0 bitsandbytes==0.50.2
#   (cd .whl && zip -d bitsandbytes-*.whl $(unzip -Z1 bitsandbytes-*.whl | grep libbitsandbytes_ | grep -v -e cuda13 -e _cpu))
#   keep='^transformers/models/(__init__\.py|auto|encoder_decoder|timm_backbone|llama|mistral|qwen2|qwen3|qwen3_moe|qwen3_5|qwen3_5_moe|qwen3_next|gemma|gemma2|gemma3|gemma4)/'
#   (cd .whl && zip -q -d transformers-*.whl $(unzip -Z1 transformers-*.whl | grep ^transformers/models/ | grep -vE "$keep"))
#   git ls-files -co --exclude-standard -z | xargs -0 du -cb | tail -1; du -cb .whl | tail -1   # together < 64 MiB
# run: bash bench/gpu_checks.sh (carry: .whl); each part has its own time limit, so the whole stays under
# about 8.5 minutes. Still to run: the Qwen3.5 graph tests with flash-linear-attention (fla-core and
# flash-linear-attention 0.6.0 wheels in .whl). With fla in every step, bfloat16 DFlash and plain decoding
# parted on an H100; the steps after the prompt now keep to the reference rule, not yet checked there.
# Run those tests alone: with fla the 9B benchmark did not finish its first steps in 70 s. Logs and JSON go to
# $OUT (the device tool brings them back): env.txt, tests.log, then NAME.log and NAME.json per benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TRITON_INTERPRET=0        # compiled kernels, whatever device files the machine shows conftest
export PYTHONPATH=$PWD
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && PYTHONPATH=/tmp/site:$PWD python3 -c "import transformers" && export PYTHONPATH=/tmp/site:$PWD \
        || echo "the carried wheels do not import here: using the machine's own packages" | tee "$OUT/wheels.txt"
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, transformers, importlib.util as u; print('torch', torch.__version__, 'cuda',
torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__, 'bitsandbytes',
bool(u.find_spec('bitsandbytes')), 'fla', bool(u.find_spec('fla')), 'causal_conv1d', bool(u.find_spec('causal_conv1d')))"
} 2>&1 | tee "$OUT/env.txt"
# the GPU-only tests, and the kernels compiled for the device;
# by name, so the CPU tests of the same files do not spend device time
timeout 170 python3 -m pytest -q -rs --durations=8 -p no:cacheprovider \
    tests/test_engine_cuda_path.py::test_cuda_graphs_give_plain_decodings_greedy_tokens \
    tests/test_engine_cuda_path.py::test_cuda_graphs_over_the_compiled_dense_decoder_give_plain_decodings_greedy_tokens \
    tests/test_engine_quantized.py::test_on_a_gpu_a_quantized_target_takes_the_cuda_path_and_stays_exact \
    tests/test_engine_triton_kernels.py 2>&1 | tee "$OUT/tests.log"
status=$?
bench() {   # NAME SECONDS ARGS...: one benchmark run, its log and JSON named NAME
    local name=$1 limit=$2; shift 2
    timeout "$limit" python3 bench/bench_cuda_steps.py --json "$OUT/$name.json" "$@" 2>&1 | tee "$OUT/$name.log"
    status=$(( status || $? ))
}
FAST="static+graphs+kernels dense+graphs+kernels"
bench dense 160 --shape qwen3-8b --variants $FAST dense+graphs+kernels+compile
bench long 80 --shape qwen3-8b --prompt 3500 --variants $FAST
bench hybrid 70 --shape qwen3.5-9b --variants static+graphs+kernels
exit $status
