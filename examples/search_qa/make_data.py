"""Generate the search-QA example's corpus and questions, deterministically (committed under data/).

The corpus describes fictional towns, so no model can answer from memory: it has to search.

    python examples/search_qa/make_data.py      # writes data/corpus.jsonl, data/train.jsonl, data/val.jsonl
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 7
VAL_FRACTION = 0.2
DATA_DIR = Path(__file__).resolve().parent / "data"

_SYLLABLES = ["var", "hol", "mer", "ost", "kel", "dun", "bra", "tis", "lor", "wen", "ash", "fen", "gar", "iru",
              "pel", "sor", "tam", "ul", "vik", "zor"]
_RIVERS = ["Esk", "Lune", "Tavy", "Ouse", "Wye", "Nene", "Aire", "Usk"]
_PRODUCTS = ["cheese", "glass", "wool", "paper", "clocks", "rope", "salt", "silk", "pottery", "cider"]
_REGIONS = ["North March", "Low Vale", "Eastern Reach", "High Moor", "Coast Shire"]
_N_TOWNS = 48

_QUESTIONS = [
    ("founded", "In which year was {town} founded?", "{founded}"),
    ("river", "On which river does {town} lie?", "{river}"),
    ("product", "What is {town} known for producing?", "{product}"),
    ("region", "In which region is {town}?", "{region}"),
    ("population", "How many people live in {town}?", "{population}"),
]


def _town_names(rng: random.Random) -> list[str]:
    names: set[str] = set()
    while len(names) < _N_TOWNS:
        names.add("".join(rng.sample(_SYLLABLES, 2)).capitalize() + rng.choice(["", "ton", "holm", "by", "wick"]))
    return sorted(names)


def make(rng: random.Random) -> tuple[list[dict], list[dict]]:
    """(documents, questions)."""
    docs, questions = [], []
    for i, town in enumerate(_town_names(rng)):
        facts = {"town": town, "founded": str(rng.randint(900, 1850)), "river": rng.choice(_RIVERS),
                 "product": rng.choice(_PRODUCTS), "region": rng.choice(_REGIONS),
                 "population": str(100 * rng.randint(12, 900))}
        text = (f"{town} is a town in the {facts['region']} on the river {facts['river']}. It was founded in "
                f"{facts['founded']} and has {facts['population']} inhabitants. {town} is known for its "
                f"{facts['product']}.")
        docs.append({"id": f"doc-{i:03d}", "title": town, "text": text})
        for kind, q, a in _QUESTIONS:
            questions.append({"question": q.format(**facts), "answer": a.format(**facts), "kind": kind,
                              "doc_id": f"doc-{i:03d}"})
    return docs, questions


def _write(path: Path, rows: list[dict], prefix: str | None = None) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps({"id": f"{prefix}-{i:04d}", **row} if prefix else row, sort_keys=True) + "\n")


def main(out_dir: Path = DATA_DIR) -> None:
    rng = random.Random(SEED)
    docs, questions = make(rng)
    towns = sorted({q["doc_id"] for q in questions})
    rng.shuffle(towns)
    val_towns = set(towns[: round(len(towns) * VAL_FRACTION)])  # held-out towns: unseen documents
    out_dir.mkdir(parents=True, exist_ok=True)
    _write(out_dir / "corpus.jsonl", docs)
    _write(out_dir / "train.jsonl", [q for q in questions if q["doc_id"] not in val_towns], "train")
    _write(out_dir / "val.jsonl", [q for q in questions if q["doc_id"] in val_towns], "val")
    print(f"{len(docs)} documents, {len(questions)} questions", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA_DIR)
