"""Token ids -> text pieces for the token-by-token view, when a tokenizer is at hand.

The store keeps token ids, not text. ``tokenizer.json`` (the Hugging Face ``tokenizers`` format, which
every fast tokenizer saves) is read with the ``tokenizers`` package when it is installed (it comes with
the ``train`` extra); without one the page shows the ids.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

__all__ = ["TokenText"]

_logger = logging.getLogger(__name__)
_TOKENIZER_FILE = "tokenizer.json"


class TokenText:
    """Decodes token ids one by one with the first ``tokenizer.json`` found in ``folders``."""

    def __init__(self, folders: Sequence[str | Path] = ()) -> None:
        self._tokenizer: Any = None
        self.path: Path | None = None
        for folder in folders:
            path = Path(folder) / _TOKENIZER_FILE
            if path.is_file():
                self._load(path)
                if self._tokenizer is not None:
                    break

    def _load(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            _logger.info("the tokenizers package is not installed; completions are shown as token ids")
            return
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
            self.path = path
        except Exception as exc:  # noqa: BLE001 - a file tokenizers cannot read: fall back to ids
            _logger.warning("cannot read %s (%s); completions are shown as token ids", path, exc)

    def pieces(self, ids: Sequence[int]) -> list[str] | None:
        """The text of each token (as the model would print it), or None without a tokenizer."""
        if self._tokenizer is None:
            return None
        return [self._tokenizer.decode([int(i)], skip_special_tokens=False) for i in ids]
