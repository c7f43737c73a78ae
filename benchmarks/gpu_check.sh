#!/usr/bin/env bash
# The checks that need a GPU, in one call on a GPU machine (BENCHMARKS.md, Evaluation speed, "Issue 35 on a GPU"):
#
#   bash benchmarks/gpu_check.sh BASELINE_CHECKOUT OUT_DIR [ROUNDS]
#
# (CASES="fewshot" times one case; EVAL_ARGS="--profile" adds eval.py's profiles;
# EVAL_LIMIT and TEST_LIMIT are the two steps' time limits in seconds.)
#
# 1. the card and the PyTorch build, as read there;
# 2. the `gpu`-marked tests (tests/test_gpu.py);
# 3. `benchmarks/eval.py` against BASELINE_CHECKOUT (an older checkout that trains its own
#    runs: --baseline-trains), few-shot and forecast, with the shipped few-shot recipe's
#    training beside them; every run trains and evaluates on the GPU (trainer.device=auto).
#
# The checks run with the machine's own python3 (PYTHON overrides it) and the checkout on
# its path; where that Python lacks the project's dependencies (hydra-core, omegaconf and
# antlr4-python3-runtime are pure Python), put a copy of them on its path first, e.g. a
# .pth file in its site-packages naming a folder that holds them.
#
# Each step has its own time limit, so one that hangs leaves the others their time; the
# logs and the benchmark's JSON land in OUT_DIR.
set -u
baseline=${1:?usage: gpu_check.sh BASELINE_CHECKOUT OUT_DIR [ROUNDS]}
out=${2:?usage: gpu_check.sh BASELINE_CHECKOUT OUT_DIR [ROUNDS]}
rounds=${3:-2}
python=${PYTHON:-python3}
# without a GPU every step would run on the CPU for minutes and time nothing it means to
if ! "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "gpu_check.sh: no GPU is visible to $python's torch; run it on the GPU machine" >&2
    exit 2
fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
    "$python" -c 'import torch, platform; print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None, "cpus", __import__("os").cpu_count())'
} 2>&1 | tee "$out/machine.txt"

timeout "${TEST_LIMIT:-180}" "$python" -m pytest tests/test_gpu.py -m gpu -q -rs \
    -p no:cacheprovider --timeout 120 2>&1 | tee "$out/gpu-tests.log"
echo "pytest exit: ${PIPESTATUS[0]}" | tee -a "$out/gpu-tests.log"

# shellcheck disable=SC2086  # CASES and EVAL_ARGS are word lists
timeout "${EVAL_LIMIT:-360}" "$python" benchmarks/eval.py --baseline "$baseline" \
    --baseline-trains --rounds "$rounds" --ets-tasks 0 --recipe \
    --cases ${CASES:-fewshot forecast} ${EVAL_ARGS:-} \
    --work /tmp/metadist-eval-gpu --json "$out/eval-gpu.json" 2>&1 | tee "$out/eval.log"
echo "eval.py exit: ${PIPESTATUS[0]}" | tee -a "$out/eval.log"
