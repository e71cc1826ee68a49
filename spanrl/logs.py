"""Where log lines go when a person watches a long command (``spanrl train``, ``spanrl demo``).

The terminal is for people: a progress bar and one line per step (``spanrl.trainer.console``). Every
log record, Python warning and third-party message goes to a file in the output folder instead; errors
still reach the terminal. ``verbose=True`` puts the log lines back on the terminal too.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

__all__ = ["LOG_FORMAT", "log_to_file", "silence_progress_bars"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Standard switches of the libraries training loads (tqdm >= 4.66, huggingface_hub, datasets, transformers).
_QUIET_ENV = {
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


def silence_progress_bars() -> None:
    """Turn off third-party progress bars ("Loading weights", "Writing model shards", ...) in this
    process and the agents it starts; a variable the user set is kept. Call it before tqdm is imported
    (transformers imports it): tqdm reads ``TQDM_DISABLE`` at import, so a bar made straight from tqdm
    (the GGUF conversion's) would show otherwise."""
    for name, value in _QUIET_ENV.items():
        os.environ.setdefault(name, value)
    if "transformers" in sys.modules:  # read at import; tell a library that is already loaded
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def log_to_file(path: Path, *, verbose: bool = False, level: str = "INFO") -> Path:
    """Send every log record (``level`` and up) and Python warning to ``path``; the terminal keeps
    errors only, or everything when ``verbose``. Third-party progress bars are turned off unless
    ``verbose``. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
    terminal = logging.StreamHandler(sys.stderr)
    terminal.setFormatter(logging.Formatter(LOG_FORMAT))
    terminal.setLevel(level.upper() if verbose else logging.ERROR)
    root.addHandler(file_handler)
    root.addHandler(terminal)
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # warnings.warn(...) -> the "py.warnings" logger -> the file
    if not verbose:  # before transformers loads: tqdm reads TQDM_DISABLE once, when it is imported
        silence_progress_bars()
    _route_transformers_logs()
    return path


def _route_transformers_logs() -> None:
    """transformers writes to its own stderr handler; send its records through ours instead."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # the base install has no transformers
        return
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
