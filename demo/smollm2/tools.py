"""The task of ``spanrl demo --model smollm2``: word-problem arithmetic with a calculator tool, for
SmolLM2-135M-Instruct.

"What is the product of 37 and 48?", "Subtract 18 from 82.", "How much is 67 plus 73?": two-digit
operands, three operations, four phrasings each. The model cannot do these in its head (greedy: 2 of 48
right, ``examples/smollm2/tool_probe.py``), so every solved episode takes two LLM calls with the
environment between them:

1. the model calls the right tool with the right arguments (OpenAI ``tools`` in the request,
   ``tool_calls`` in the response, through the policy server's ``<tool_call>`` parsing);
2. the agent runs the tool (an ``execute_tool`` span) and sends the result back as a ``tool`` message;
3. the model answers; the reward is 1 when the reply ends with the right number (``reward``).

The lesson RL has to learn is which tool and which argument order each phrasing means ("Subtract 18 from
82" is ``subtract(82, 18)``); the call format itself comes from three solved examples in the conversation
(``SHOTS``, one per tool, in plain symbols), without which the base model makes no parsable call.

SmolLM2's own chat template drops ``tools`` and ``tool_calls`` (it renders only ``content``), so the
model folder used here carries ``CHAT_TEMPLATE``, a Hermes-style template (``tool_model``): the tools in
the system prompt, an assistant's calls as ``<tool_call>{...}</tool_call>``, a tool result as a ``tool``
turn. Held-out tasks never share an (operation, a, b) triple with training tasks or the shots, whatever
the seeds: a triple is held out or trained on by its content (``held_out``, a hash), never by the seed's
random stream, so seed 1's training tasks cannot be seed 0's held-out ones. ``add`` and ``multiply``
are split by their unordered operands (37 + 48 and 48 + 37 fall on one side).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from spanrl.errors import ConfigError

__all__ = ["CHAT_TEMPLATE", "HELD_OUT_SHARE", "OPS", "SHOTS", "SHOT_TRIPLES", "TOOLS", "held_out", "load_tasks",
           "make_tasks", "reward", "run_tool", "shot_keys", "solved_episode", "split", "tool_model"]

OPS = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b}
_DESCRIPTIONS = {"add": "a + b", "subtract": "a - b", "multiply": "a * b"}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": name, "description": _DESCRIPTIONS[name],
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}}
    for name in OPS
]
PHRASINGS = {
    "add": ("What is the sum of {a} and {b}?", "How much is {a} plus {b}?", "Add {a} and {b}.",
            "What do you get when you add {b} to {a}?"),
    "subtract": ("What is {a} minus {b}?", "Subtract {b} from {a}.", "What is the difference between {a} and {b}?",
                 "How much is left when you take {b} away from {a}?"),
    "multiply": ("What is the product of {a} and {b}?", "How much is {a} times {b}?", "Multiply {a} by {b}.",
                 "What is {a} multiplied by {b}?"),
}
SHOT_TRIPLES = (("multiply", 23, 41), ("add", 57, 68), ("subtract", 34, 79))
"""The (operation, a, b) of each solved episode in ``SHOTS``: never a task (``shot_keys``)."""
_SYMBOL = {"add": "+", "subtract": "-", "multiply": "*"}


def solved_episode(op: str, a: int, b: int, k: int) -> list[dict[str, Any]]:
    """One solved example in plain symbols: ``What is a op b?``, the tool call (id ``call_k``), its result,
    the result as the answer."""
    call_id, result = f"call_{k}", str(OPS[op](a, b))
    return [
        {"role": "user", "content": f"What is {a} {_SYMBOL[op]} {b}?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": op, "arguments": json.dumps({"a": a, "b": b})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": result},
    ]


SHOTS: list[dict[str, Any]] = [m for k, triple in enumerate(SHOT_TRIPLES) for m in solved_episode(*triple, k)]
"""Three solved episodes (one per tool) the agent sends before the question."""

CHAT_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\nYou are a helpful assistant with tools: ' }}"
    "{%- for tool in tools %}"
    "{{ tool['function']['name'] }}({{ tool['function']['parameters']['properties'] | join(', ') }})"
    "{%- if not loop.last %}{{ ', ' }}{% endif %}{% endfor %}"
    "{{ '. Call one with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- if not tools %}{{ '<|im_start|>system\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if message['content'] %}{{ message['content'] + '\\n' }}{% endif %}"
    "{%- for call in message['tool_calls'] %}{{ '<tool_call>' }}"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "{{ '</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2's ChatML with tools: declared tools in the system prompt (it replaces a system message),
calls as ``<tool_call>`` JSON (the shape ``spanrl.serving.chat.parse_tool_calls`` reads back)."""


def tool_model(base: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """A model folder ``out`` that is ``base`` with ``CHAT_TEMPLATE`` as its chat template (weights linked,
    not copied); made once, atomically."""
    base, out = Path(base), Path(out)
    if (out / "config.json").is_file():
        return out
    from transformers import AutoTokenizer

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for item in base.iterdir():
        if item.is_file() and not item.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            (tmp / item.name).symlink_to(item.resolve())
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, out)
    return out


def reward(reply: str, answer: str) -> float:
    """1.0 when the reply ends with the answer: its last number is the answer and nothing but a period
    follows ("18", "6 * 3 = 18", "The answer is 18." score; a reply that runs on, or is cut off by the
    token limit, after the number does not), else 0.0."""
    match = re.search(r"(-?\d+)\s*\.?\s*$", reply.replace(",", ""))
    return 1.0 if match is not None and match.group(1) == answer else 0.0


def run_tool(name: str, arguments: str | dict[str, Any]) -> str:
    """The calculator: the tool's result as text, or ``error: ...`` for a bad call (shown to the model)."""
    if name not in OPS:
        return f"error: unknown tool {name!r}; the tools are {', '.join(OPS)}"
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
        return str(OPS[name](int(args["a"]), int(args["b"])))
    except (KeyError, TypeError, ValueError) as exc:
        return f"error: {name} takes integer arguments a and b ({type(exc).__name__}: {exc})"


HELD_OUT_SHARE = 0.25
"""The share of (operation, a, b) triples held out (``held_out``)."""


def held_out(key: str, share: float = HELD_OUT_SHARE) -> bool:
    """Whether the task of split key ``key`` is a held-out one: by a hash of its content, the same for every
    seed and run, so no seed's training stream can hold another seed's held-out task."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") < share * 2**64


def _split_key(op: str, a: int, b: int) -> str:
    """The key the held-out split goes by: a commutative operation's operands unordered."""
    return f"{op}:{min(a, b)}:{max(a, b)}" if op in ("add", "multiply") else f"{op}:{a}:{b}"


def make_tasks(n: int, *, seed: int, exclude: set[str] | None = None, part: str | None = None) -> list[dict[str, Any]]:
    """``n`` tasks with distinct (operation, a, b) keys, none in ``exclude``; ``part`` ``train`` or ``val``: only
    triples on that side of ``held_out`` (None: any)."""
    rng, seen, tasks = random.Random(f"tools-{part or 'any'}-{seed}"), set(exclude or ()), []
    while len(tasks) < n:
        op, a, b = rng.choice(tuple(OPS)), rng.randint(10, 99), rng.randint(10, 99)
        key = f"{op}:{a}:{b}"
        if key in seen or (part is not None and held_out(_split_key(op, a, b)) != (part == "val")):
            continue
        seen.add(key)
        question = rng.choice(PHRASINGS[op]).format(a=a, b=b)
        tasks.append({"id": f"tools-{part or 'any'}-{seed}-{len(tasks)}", "key": key, "question": question,
                      "answer": str(OPS[op](a, b)), "tool": op})
    return tasks


def split(n_train: int, n_val: int, *, seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and held-out tasks of ``seed``: no triple of any seed's held-out tasks (nor its reverse, for add
    and multiply) is trained on by any seed, and none is a shot's."""
    shots = shot_keys(SHOT_TRIPLES)
    return (make_tasks(n_train, seed=seed, exclude=shots, part="train"),
            make_tasks(n_val, seed=seed, exclude=shots, part="val"))


def shot_keys(triples: Iterable[tuple[str, int, int]]) -> set[str]:
    """The task keys a shot's triple rules out: the triple, and its reverse for add and multiply."""
    triples = list(triples)
    return ({f"{op}:{a}:{b}" for op, a, b in triples}
            | {f"{op}:{b}:{a}" for op, a, b in triples if op != "subtract"})


def load_tasks(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Held-out tasks of one's own: one ``{"question": ..., "answer": ...}`` JSON object a line (the answer
    is the exact final string the reward checks); blank lines skipped."""
    if not Path(path).is_file():
        raise ConfigError(f"held-out tasks: no such file {str(path)!r}")
    tasks = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{path}:{n}: not a JSON object ({exc})") from None
        if not isinstance(item, dict) or not isinstance(item.get("question"), str) or "answer" not in item:
            raise ConfigError(f"{path}:{n}: each line must be {{\"question\": str, \"answer\": str}}, "
                              f"got {line[:80]!r}")
        tasks.append({"id": str(item.get("id", f"val-{n}")), "question": item["question"],
                      "answer": str(item["answer"])})

    if not tasks:
        raise ConfigError(f"{path}: no tasks")
    return tasks
