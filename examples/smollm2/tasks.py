"""Arithmetic tasks for SmolLM2-135M-Instruct with a strict answer format, and their reward.

Three families (``probe.py`` measures the base model's greedy success on each):

- ``add``: "What is 47 + 38? Reply with only the number." (two-digit addition)
- ``word``: one-step word problems ("Sam has 12 apples and buys 7 more. ..."), small numbers
- ``mul``: "What is 7 * 8?", "What is 7 times 8?", "Multiply 7 by 8." (2 to 12; held-out operand
  pairs never appear in training, in either order, for any seed)

The held-out split goes by a task's content (``spanrl.demo.smollm2.tools.held_out``, a hash of its
unordered operands or, for ``word``, its question), the same for every seed: seed 1's training tasks
cannot be seed 0's held-out ones, and 7 * 8 is held out exactly when 8 * 7 is.

The reward is strict about the end of the reply: 1.0 when it ends with the answer ("85",
"47 + 38 = 85", "The answer is 85."), 0.0 when it is wrong or runs on after the number (a reply cut
off by the token limit never scores). ``exact`` (only the number) and ``lenient`` (the arithmetic is
right, whatever follows) are diagnostics that tell format errors from arithmetic errors.
"""

from __future__ import annotations

import random
import re
from typing import Any

from spanrl.demo.smollm2.tools import held_out, reward  # one reward for both SmolLM2 tasks

__all__ = ["FAMILIES", "exact", "lenient", "make_tasks", "messages", "reward", "split"]

FAMILIES = ("add", "word", "mul")
INSTRUCTION = "Reply with only the number."
_NAMES = ("Sam", "Ana", "Li", "Omar", "Kim", "Tom", "Eva", "Raj")
_THINGS = ("apples", "books", "coins", "stickers", "pens", "cards", "shells", "marbles")


_HELD_OUT_SHARE = {"add": 0.25, "word": 0.25, "mul": 0.4}  # mul has 66 unordered pairs: 0.4 leaves ~26 held out


def _split_key(family: str, key: str) -> str:
    """What the held-out split goes by: the unordered operands (add, mul), the question (word)."""
    if family == "word":
        return f"word:{key}"
    sep = "+" if family == "add" else "*"
    a, b = sorted(int(x) for x in key.split(sep))
    return f"{family}:{a}{sep}{b}"


def _add(rng: random.Random) -> tuple[str, int, str]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"What is {a} + {b}?", a + b, f"{a}+{b}"


def _mul(rng: random.Random) -> tuple[str, int, str]:
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    phrasing = rng.choice(("What is {a} * {b}?", "What is {a} times {b}?", "Multiply {a} by {b}."))
    return phrasing.format(a=a, b=b), a * b, f"{a}*{b}"  # the key: one operand pair, any phrasing


def _word(rng: random.Random) -> tuple[str, int, str]:
    name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    a, b = rng.randint(5, 30), rng.randint(2, 20)
    if rng.random() < 0.5:
        question = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?"
        return question, a + b, question
    a = a + b  # keep the difference positive
    question = f"{name} has {a} {thing} and gives away {b}. How many {thing} does {name} have left?"
    return question, a - b, question


_MAKERS = {"add": _add, "word": _word, "mul": _mul}
_MAX_SHOTS = 8


def make_tasks(family: str, n: int, *, seed: int, exclude: set[str] | None = None,
               part: str | None = None) -> list[dict[str, Any]]:
    """``n`` distinct tasks of ``family`` (none whose key, the operands, is in ``exclude``) with answers;
    ``part`` ``train`` or ``val``: only tasks on that side of the held-out split (None: any)."""
    if family not in _MAKERS:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    rng = random.Random(f"{family}-{seed}" if part is None else f"{family}-{part}-{seed}")
    excluded, seen, tasks = set(exclude or ()), set(), []
    for _ in range(1000 * n):
        question, answer, key = _MAKERS[family](rng)
        if question in seen or _split_key(family, key) in excluded:
            continue
        if part is not None and held_out(_split_key(family, key), _HELD_OUT_SHARE[family]) != (part == "val"):
            continue
        seen.add(question)
        tasks.append({"id": f"{family}-{seed}-{len(tasks)}", "family": family, "key": key,
                      "question": f"{question} {INSTRUCTION}", "answer": str(answer)})
        if len(tasks) == n:
            return tasks
    raise ValueError(f"family {family!r} has fewer than {n} distinct tasks")


def split(family: str, n_train: int, n_val: int, *, seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and held-out tasks of ``seed``: no held-out operands (in either order) of any seed appear in any
    seed's training tasks, and none are the shots'."""
    shots = {_split_key(family, t["key"]) for t in make_tasks(family, _MAX_SHOTS, seed=-1)}
    return (make_tasks(family, n_train, seed=seed, exclude=shots, part="train"),
            make_tasks(family, n_val, seed=seed, exclude=shots, part="val"))


def messages(question: str, family: str, shots: int = 2) -> list[dict[str, str]]:
    """The chat for ``question``: ``shots`` solved examples of ``family`` (user, assistant), then the question.

    The examples show the format; without them the base model writes "32 + 22 = 54" and never scores."""
    if not 0 <= shots <= _MAX_SHOTS:
        raise ValueError(f"shots must be in 0..{_MAX_SHOTS}, got {shots!r}")
    demos = make_tasks(family, shots, seed=-1) if shots else []
    chat = [m for d in demos
            for m in ({"role": "user", "content": d["question"]}, {"role": "assistant", "content": d["answer"]})]

    return chat + [{"role": "user", "content": question}]


def exact(reply: str, answer: str) -> float:
    """1.0 when the reply is only the number (spaces and one final period allowed); diagnostics only."""
    text = reply.strip()
    if text.endswith("."):
        text = text[:-1].rstrip()
    return 1.0 if text == answer else 0.0


def lenient(reply: str, answer: str) -> float:
    """1.0 when the answer is the first number after "=" or, without one, the last number; whatever
    follows (diagnostics only: the arithmetic is right, the format may not be)."""
    text = reply.replace(",", "")
    after = re.search(r"=\s*(-?\d+)", text)
    numbers = [after.group(1)] if after else re.findall(r"-?\d+", text)[-1:]
    return 1.0 if numbers and numbers[0] == answer else 0.0
