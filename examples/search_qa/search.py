"""The search-QA example's local tool and reward: BM25 over the shipped corpus (no network), and answer
scoring.

Reward (``answer_reward``): 1.0 when the normalised answer equals the gold one (lower case, punctuation
and articles dropped), else the token F1 between them (SQuAD's metric), so "the river Esk" against
"Esk" earns partial credit and a wrong answer 0.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
CORPUS_PATH = DATA_DIR / "corpus.jsonl"
BM25_K1 = 1.5
BM25_B = 0.75
DEFAULT_TOP_K = 2

_TOKEN = re.compile(r"[a-z0-9]+")
_ARTICLES = {"a", "an", "the"}


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


@dataclass(frozen=True)
class Hit:
    doc_id: str
    title: str
    text: str
    score: float


class BM25Index:
    """Okapi BM25 over a list of {"id", "title", "text"} documents."""

    def __init__(self, docs: list[dict]) -> None:
        if not docs:
            raise ValueError("docs must hold at least one document")
        self.docs = docs
        self._tfs = [Counter(tokenize(d["title"] + " " + d["text"])) for d in docs]
        self._lens = [sum(tf.values()) for tf in self._tfs]
        self._avg_len = sum(self._lens) / len(self._lens)
        df: Counter[str] = Counter()
        for tf in self._tfs:
            df.update(tf.keys())
        n = len(docs)
        self._idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def search(self, query: str, k: int = DEFAULT_TOP_K) -> list[Hit]:
        """The ``k`` best documents for ``query`` (ties by corpus order); none when no term matches."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k!r}")
        terms = [t for t in tokenize(query) if t in self._idf]
        scored = []
        for i, tf in enumerate(self._tfs):
            s = 0.0
            for t in terms:
                f = tf.get(t, 0)
                if f:
                    norm = 1 - BM25_B + BM25_B * self._lens[i] / self._avg_len
                    s += self._idf[t] * f * (BM25_K1 + 1) / (f + BM25_K1 * norm)

            if s > 0:
                scored.append((s, i))
        scored.sort(key=lambda x: (-x[0], x[1]))
        return [Hit(self.docs[i]["id"], self.docs[i]["title"], self.docs[i]["text"], s) for s, i in scored[:k]]


@lru_cache(maxsize=1)
def default_index() -> BM25Index:
    """The index over the shipped corpus (built once per process)."""
    docs = [json.loads(line) for line in CORPUS_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]
    return BM25Index(docs)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(w for w in text.split() if w not in _ARTICLES)


def answer_reward(prediction: str, gold: str) -> float:
    """1.0 on a normalised exact match, else token F1 (see the module docstring)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref and bool(pred))
    if pred == ref:
        return 1.0
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def load_questions(split: str, data_dir: Path = DATA_DIR) -> list[dict]:
    """Questions of ``train`` or ``val``."""
    path = data_dir / f"{split}.jsonl"
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
