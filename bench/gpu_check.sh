#!/usr/bin/env bash
# The device check: GRPO steps of the SmolLM2 tool agent (rollouts through the embedded policy server) on one
# GPU, bf16, for SmolLM2-135M's shape and random-weight Qwen2.5-0.5B and -1.5B shapes, each printing per step
# rollout s, update s, reload s, peak GPU memory, tokens/s, the update's share of 790 TFLOP/s, approx_kl and
# clipfrac (bench/gpu_check.py says what each is). About 4-6 minutes; the models are given 240 s each.
#
# The lent GPU machines have no network: everything they lack travels in .whl/ (gitignored), made here by
#   make gpu-wheels       # bench/gpu_wheels.py: ~44 MiB of wheels (CPython 3.12 manylinux) + the spanrl
#                         # wheel + SmolLM2's tokenizer, checked in a clean 3.12 venv
# then ONE device call (the `run` tool; on a machine with a GPU and pip, plain `bash bench/gpu_check.sh`):
#   run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=600)
# It prints one "gpu_check:" line per figure and leaves the log in $OUT/gpu_check.log.
#
#   bench/gpu_check.sh --device cpu     # the dry run here (CI: make gpu-check-dry): .venv, tiny shapes
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS

if [[ "${1:-}" == "--device" && "${2:-}" == "cpu" ]]; then
    PY=${PYTHON:-.venv/bin/python}
    exec "$PY" bench/gpu_check.py --device cpu --tiny --models smollm2 qwen2-0.5b --steps 2 --tasks 2 --group 4 \
        --max-tokens 16 --micro 8 --model-timeout-s 150
fi

[[ -d .whl ]] || { echo "gpu_check: no .whl/ here: run 'make gpu-wheels' where pip works and carry .whl"; exit 1; }
BYTES=$(du -sb .whl | cut -f1)
echo "gpu_check: carried .whl/ is $((BYTES / 1024 / 1024)) MiB (the call's limit, working tree included: 64 MiB)"
PY=python3
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
echo "gpu_check: installed from .whl/ in $((SECONDS - START)) s"
REPO=$PWD
cd "$(mktemp -d -t spanrl-gpu-check-XXXX)"  # not the checkout: its spanrl/ folder would shadow the installed wheel
"$PY" -c "import sys, torch, transformers, trl, peft, accelerate, pyarrow, duckdb, google.protobuf as pb, grpc, spanrl
print('gpu_check: Python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__,
      'trl', trl.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__, 'pyarrow', pyarrow.__version__,
      'duckdb', duckdb.__version__, 'protobuf', pb.__version__, 'grpcio', grpc.__version__, 'spanrl from', spanrl.__file__)"
LOG=${OUT:-/tmp}/gpu_check.log
set -o pipefail
"$PY" "$REPO/bench/gpu_check.py" --device cuda --tokenizer "$REPO/.whl/smollm2-tokenizer" "$@" 2>&1 | tee "$LOG"
echo "gpu_check: done in $((SECONDS - START)) s"
