"""Aggregation keeps per-call credit: a merged sample carries each call's advantage on that call's tokens, and
GRPO on merged samples makes the same update as GRPO on one sample per call (issue 52, item 1c)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_transitions import Recorder, Rollout, deliver
from toy_task import build_model, prompt_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.grpo import GRPO
from spanrl.algorithms.transitions import TransitionBatch, load_transitions

STEP = CreditConfig(mode="step", gamma=0.5, scale_std=False)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny") / "model")


def _grpo(model_path: Path, out: Path) -> GRPO:
    algo = GRPO(learning_rate=1e-2, bf16=False, use_old_logprobs=False)
    algo.setup(model_path=model_path, output_dir=out, seed=0)
    return algo


def _deliver(collector: Any, tok: Any) -> int:
    """Rollouts a (reward 1) and b (0) of one task, two calls each, the second prompt extending the first
    call's prompt and completion; returns the number of glue tokens between the two completions."""
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    first, second = prompt_ids(tok, 1), prompt_ids(tok, 2)[1:]
    rec = Recorder()
    for rid, answer, reward in (("a", yes, 1.0), ("b", no, 0.0)):
        r = Rollout(rec, rid, task_id="t1")
        root = r.root(0, 200)
        r.call(root, 10, first, [answer], [-0.3])
        r.call(root, 40, first + [answer] + second, [answer, yes], [-0.4, -0.2])
        r.reward(root, 90, reward)
    deliver(collector, rec.spans())
    return len(second)


def test_a_merged_sample_carries_each_calls_advantage_on_its_tokens(collector: Any, model_path: Path,
                                                                     tmp_path: Path) -> None:
    glue = _deliver(collector, _grpo(model_path, tmp_path / "g").tokenizer)
    merged = {t.rollout_id: t for t in load_transitions(collector.store, credit=STEP, aggregate=True).transitions}
    # returns-to-go (gamma 0.5, the reward after call 1): a [0.5, 1], b [0, 0]; step means 0.25, 0.5
    assert merged["a"].advantage == 0.25 and merged["b"].advantage == -0.25  # the first call's
    assert merged["a"].token_advantages == [0.25] + [0.0] * glue + [0.5, 0.5]
    assert merged["b"].token_advantages == [-0.25] + [0.0] * glue + [-0.5, -0.5]
    alike = load_transitions(collector.store, credit=CreditConfig(scale_std=False), aggregate=True).transitions
    assert [t.token_advantages for t in alike] == [[], []]  # identical: one advantage per rollout, no column


def test_grpo_on_merged_samples_makes_the_per_call_update(collector: Any, model_path: Path, tmp_path: Path) -> None:
    per_call, merged, first_only = (_grpo(model_path, tmp_path / name) for name in ("calls", "merged", "first"))
    _deliver(collector, per_call.tokenizer)
    apart = load_transitions(collector.store, credit=STEP)
    together = load_transitions(collector.store, credit=STEP, aggregate=True)
    assert len(apart) == 4 and len(together) == 2
    table = together.to_arrow()  # as before: every token of a merged sample on its first call's advantage
    lost = table.set_column(table.schema.get_field_index("token_advantages"), "token_advantages",
                            pa.array([[], []], pa.list_(pa.float32())))

    runs = [algo.update(batch) for algo, batch in ((per_call, apart), (merged, together),
                                                   (first_only, TransitionBatch(lost, together.report,
                                                                                together.rewards_by_rollout)))]
    loss, norm = ([r[key] for r in runs] for key in ("losses/policy_loss", "charts/grad_norm"))
    print(f"policy loss {loss}, gradient norm {norm}")
    # dapo: every token's loss over the step's loss tokens, the same tokens in both layouts, each under the same
    # prefix: the same loss and gradient (Adam's first step moves every weight by about lr whatever the
    # gradient's size, so the gradient is compared, not the weights)
    assert loss[1] == pytest.approx(loss[0], rel=1e-5) and norm[1] == pytest.approx(norm[0], rel=1e-6)
    assert norm[0] > 1e-3 and abs(norm[2] - norm[0]) > 0.05 * norm[0]  # the first call's advantage alone: another


def _row(rid: str, completion: list[int], advantage: float, per_token: list[float]) -> dict:
    return dict(rollout_id=rid, task_id="t", attempt=1, agent=None, step=0, prompt_ids=[1, 2],
                completion_ids=completion, completion_mask=[1] * len(completion), old_logprobs=[], reward=1.0,
                advantage=advantage, policy_version=0, retokenized=False, temperature=None,
                token_advantages=per_token)


def test_padding_gives_per_token_advantages_only_when_a_row_has_them() -> None:
    from spanrl.algorithms.tables import TRANSITIONS_SCHEMA, check_transitions, pad_transitions
    from spanrl.errors import ConfigError

    table = pa.Table.from_pylist([_row("a", [3, 4, 5], 0.25, [0.25, 0.0, 0.5]), _row("b", [3], -1.0, [])],
                                 schema=TRANSITIONS_SCHEMA)
    check_transitions(table)
    padded = pad_transitions(table, pad_token_id=0)
    assert padded.advantages.tolist() == [0.25, -1.0]
    assert padded.token_advantages.tolist() == [[0.25, 0.0, 0.5], [-1.0, -1.0, -1.0]]  # b: its advantage throughout
    assert padded.loss_advantages(2).shape == (2, 2) and padded.rows_with_advantage().tolist() == [True, True]
    plain = pad_transitions(table.slice(1, 1), pad_token_id=0)
    assert plain.token_advantages is None and plain.loss_advantages(1).shape == (1,)
    bad = pa.Table.from_pylist([_row("c", [3, 4], 0.1, [0.1])], schema=TRANSITIONS_SCHEMA)
    with pytest.raises(ConfigError, match=r"^transition 0 \(rollout_id='c', step=0\): token_advantages has 1 entries, "
                                          r"completion_ids 2$"):
        check_transitions(bad)
    rows = [_row("d", [3], 0.1, []), _row("e", [3], 0.1, [float("nan")])]
    nan = pa.Table.from_pylist(rows, schema=TRANSITIONS_SCHEMA)
    with pytest.raises(ConfigError, match=r"^transition 1 \(rollout_id='e', step=0\): token_advantages must be finite"):
        check_transitions(nan)


def test_glue_stays_at_zero_when_the_first_calls_advantages_were_equal() -> None:
    # three calls of one conversation, advantages 0.5, 0.5, 1.0: calls 1 and 2 merge with one advantage (no
    # per-token column yet), then call 3 differs; the glue between 1 and 2 is masked and must read 0, not 0.5
    from spanrl.algorithms.transitions import _aggregate

    def call(prompt: list[int], completion: list[int], advantage: float) -> dict[str, Any]:
        return {"rollout_id": "a", "agent": None, "prompt_ids": prompt, "completion_ids": completion,
                "completion_mask": [1] * len(completion), "old_logprobs": [-0.1] * len(completion),
                "retokenized": False, "advantage": advantage, "token_advantages": []}

    rows = [call([1], [2], 0.5), call([1, 2, 9], [3], 0.5), call([1, 2, 9, 3, 8], [4, 5], 1.0)]
    report: dict[str, int] = {}
    (merged,) = _aggregate(rows, report)
    assert merged["completion_ids"] == [2, 9, 3, 8, 4, 5] and merged["completion_mask"] == [1, 0, 1, 0, 1, 1]
    assert merged["token_advantages"] == [0.5, 0.0, 0.5, 0.0, 1.0, 1.0]
    assert report["merged"] == 2
