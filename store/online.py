"""Queries the online trainer follows the store with: rollouts that became trainable since a watermark.

A rollout is **complete** when its end is stored (``store/views.sql``'s ``rollout_state``: its
``spanrl.rollout`` span or a ``spanrl.rollout.end`` span; ``complete_ns`` = when that span was ingested),
or, for an agent that stores neither, once no span of it (feedback aside) arrived for ``quiet_s`` (None:
the store's one quiet time, ``views.sql``'s ``rollout_quiet_ns()``, which ``rollout_state`` uses too). It
**failed** when that span has status ERROR (``rollout_state``'s ``failed``). It is
**ready** when it is complete and has a reward: ``ready_ns = greatest(complete_ns, first_reward_ns)``,
on the collector's clock (``ingested_ns``). ``ready_ns`` never changes once set (later feedback only
arrives later), so ``(ready_ns, rollout_id)`` is a watermark: everything at or below it was handled.

Rewards are ``rollout_rewards``' rows: the agent's own reward spans and events and late feedback
(``docs/conventions.md``: a ``gen_ai.evaluation.result`` event, or a span with its attributes, naming a
``gen_ai.response.id``; or a ``spanrl.feedback`` span), each resolved to its rollout by views.sql's one
rule, the same for every reader (the ``rollouts`` view, the viewer, the decomposer). Spans belong to
rollouts by ``rollout_spans``; every macro reads only spans ingested since the horizon less ``max_age_s``,
so a poll costs the same however large the store grows. Several rewards combine by one rule: **the latest
stored wins** (by the collector's ``ingested_ns``, then the sender's timestamp within one commit: a later
judgment corrects an earlier one, and a verdict stamped in the far future does not win forever).

Unusable rewards (non-finite, out of range: ``store/views.sql``'s ``reward_usable``) never win; a rollout
with only such rewards is still ready, with ``reward`` None, so the trainer can quarantine it.

Each query is ONE read-only statement, so it runs on a ``SpanStore`` or through a collector's SQL
endpoint (``RemoteStore``) alike. Time windows are nanoseconds on the collector's clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spanrl import semconv as sc

__all__ = ["ReadyRollout", "RewardStats", "Watermark", "count_aged_out", "now_ns", "ready_rollouts", "ready_window",
           "version_rewards"]

_NS_PER_S = 1_000_000_000

# Per rollout whose spans were all ingested after $horizon_ns: completion, task, failure, policy
# versions, and the resolved rewards (latest by time wins). Shared by both queries below. The horizon
# only grows (the caller keeps it 2 x max_age behind its watermark), so a rollout it excludes stays
# excluded: its ready_ns can never change from a partial view. Spans are read from max_age before the
# horizon, so only a rollout longer than max_age could still be cut. Attribution, stored end, failure
# and rewards with their resolution are store/views.sql's (rollout_spans, rollout_state, rollout_rewards),
# all bounded by that since; $quiet_ns is the online trainer's own when given
# (NULL: views.sql's rollout_quiet_ns()). Feedback spans never count as a rollout's activity, so late
# feedback cannot move a quiet rollout's completion.
_ROLLOUT_STATE = f"""
WITH sp AS (
    SELECT * FROM rollout_spans($horizon_ns - $max_age_ns)
), resolved AS (  -- each reward with its rollout: views.sql's one rule (rollout_rewards)
    SELECT rollout_id, time_ns, value, usable, ingested_ns, is_feedback
    FROM rollout_rewards($horizon_ns - $max_age_ns, usable_only := FALSE)
    WHERE $reward_name IS NULL OR name = $reward_name
), rewarded AS (
    SELECT rollout_id, arg_max(value, [ingested_ns, time_ns]) FILTER (WHERE usable) AS reward,
           min(ingested_ns) AS first_reward_ns, count(*) FILTER (WHERE NOT usable) AS bad_rewards,
           count(*) AS reward_count, count(*) FILTER (WHERE is_feedback) AS feedback_count
    FROM resolved WHERE rollout_id IS NOT NULL GROUP BY rollout_id
), ro AS (
    SELECT rollout_id, max(ingested_ns) AS last_ns,
           min(policy_version) FILTER (WHERE prompt_token_ids IS NOT NULL) AS min_policy_version,
           max(policy_version) FILTER (WHERE prompt_token_ids IS NOT NULL) AS max_policy_version,
           count(*) FILTER (WHERE prompt_token_ids IS NOT NULL) AS token_calls
    FROM sp
    WHERE rollout_id IS NOT NULL AND name <> '{sc.FEEDBACK_SPAN_NAME}'
    GROUP BY rollout_id
    HAVING min(ingested_ns) > $horizon_ns  -- whole rollouts only: one the horizon cuts is never seen again
), st AS (
    SELECT ro.*, rs.task_id, rs.failed, rs.end_ingested_ns AS closed_ns, rewarded.reward, rewarded.first_reward_ns,
           coalesce(rewarded.reward_count, 0) AS reward_count, coalesce(rewarded.feedback_count, 0) AS feedback_count,
           coalesce(rewarded.bad_rewards, 0) AS bad_rewards,
           coalesce(rs.end_ingested_ns, CASE WHEN ro.last_ns + coalesce($quiet_ns, rollout_quiet_ns()) <= $now_ns
                                         THEN ro.last_ns + coalesce($quiet_ns, rollout_quiet_ns()) END)
               AS complete_ns
    FROM ro JOIN rollout_state($horizon_ns - $max_age_ns) rs USING (rollout_id) LEFT JOIN rewarded USING (rollout_id)
)
"""

_READY = _ROLLOUT_STATE + """
SELECT rollout_id, task_id, reward, reward_count, feedback_count, bad_rewards, min_policy_version,
       max_policy_version, token_calls, greatest(complete_ns, first_reward_ns) AS ready_ns
FROM st
WHERE NOT failed AND complete_ns IS NOT NULL AND first_reward_ns IS NOT NULL
  AND first_reward_ns <= complete_ns + $max_age_ns
  AND greatest(complete_ns, first_reward_ns) <= $now_ns - $settle_ns
  AND (greatest(complete_ns, first_reward_ns) > $wm_ns
       OR (greatest(complete_ns, first_reward_ns) = $wm_ns AND rollout_id > $wm_id))
ORDER BY ready_ns, rollout_id
LIMIT $limit
"""

_AGED = _ROLLOUT_STATE + """
SELECT count(*) FILTER (WHERE NOT failed) AS aged_out, count(*) FILTER (WHERE failed) AS failed
FROM st
WHERE complete_ns IS NOT NULL AND complete_ns > $since_ns - $max_age_ns AND complete_ns <= $now_ns - $max_age_ns
  AND (failed OR first_reward_ns IS NULL OR first_reward_ns > complete_ns + $max_age_ns)
"""


@dataclass(frozen=True)
class Watermark:
    """Everything with ``(ready_ns, rollout_id)`` at or below this was handled (trained or skipped)."""

    ready_ns: int = 0
    rollout_id: str = ""


@dataclass(frozen=True)
class ReadyRollout:
    """A complete, rewarded rollout, with its combined reward (the latest usable one stored wins).

    ``reward`` is None when every reward it got was unusable (``bad_rewards`` of them: non-finite or
    out of range, stored before the collector checked): the trainer quarantines it."""

    rollout_id: str
    task_id: str | None
    reward: float | None
    reward_count: int
    feedback_count: int
    min_policy_version: int | None
    token_calls: int
    ready_ns: int
    bad_rewards: int = 0
    max_policy_version: int | None = None
    """The newest policy version that served one of its calls (``min_policy_version`` the oldest)."""


def now_ns(store: Any) -> int:
    """The store's clock (the collector's, through its SQL endpoint): what ``ingested_ns`` is measured on."""
    table = store.sql("SELECT epoch_us(get_current_timestamp()) * 1000 AS now_ns")
    return int(table.column("now_ns")[0].as_py())


def _params(now: int, horizon_ns: int, *, quiet_s: float | None, max_age_s: float,
            reward_name: str | None) -> dict[str, Any]:
    return {"now_ns": now, "horizon_ns": horizon_ns, "quiet_ns": None if quiet_s is None else int(quiet_s * _NS_PER_S),
            "max_age_ns": int(max_age_s * _NS_PER_S), "reward_name": reward_name}


def ready_rollouts(
    store: Any,
    watermark: Watermark,
    *,
    now: int,
    horizon_ns: int,
    settle_s: float,
    max_age_s: float,
    quiet_s: float | None = None,
    reward_name: str | None = None,
    limit: int = 10_000,
) -> list[ReadyRollout]:
    """Rollouts ready after ``watermark`` and at least ``settle_s`` before ``now``, oldest first.

    Only rollouts whose spans were all ingested after ``horizon_ns`` are considered. Feedback that first
    arrives more than ``max_age_s`` after its rollout completed is ignored (the rollout was counted as aged
    out).

    """
    params = _params(now, horizon_ns, quiet_s=quiet_s, max_age_s=max_age_s, reward_name=reward_name)
    params.update({"settle_ns": int(settle_s * _NS_PER_S), "wm_ns": watermark.ready_ns, "wm_id": watermark.rollout_id,
                   "limit": int(limit)})
    rows = store.sql(_READY, params).to_pylist()
    return [ReadyRollout(
        rollout_id=r["rollout_id"], task_id=r["task_id"], reward=None if r["reward"] is None else float(r["reward"]),
        reward_count=int(r["reward_count"]), bad_rewards=int(r["bad_rewards"]),
        feedback_count=int(r["feedback_count"]), min_policy_version=r["min_policy_version"],
        max_policy_version=r["max_policy_version"],
        token_calls=int(r["token_calls"]), ready_ns=int(r["ready_ns"]),
    ) for r in rows]


def ready_window(store: Any, watermark: Watermark, *, usable: Callable[[ReadyRollout], bool], most: int,
                 **query: Any) -> tuple[list[ReadyRollout], list[ReadyRollout]]:
    """``ready_rollouts`` (``query``: its arguments) through the ``most``-th one ``usable`` accepts, or all of
    them; and the usable ones. Rollouts that will never train take no place: a window of ``most`` ready
    rollouts with few usable ones, the first of them leading, would hold back the usable ones behind it."""
    limit = most
    while True:
        ready = ready_rollouts(store, watermark, limit=limit, **query)
        picked = [i for i, r in enumerate(ready) if usable(r)]
        if len(picked) >= most:
            return ready[: picked[most - 1] + 1], [ready[i] for i in picked[:most]]
        if len(ready) < limit:
            return ready, [ready[i] for i in picked]
        limit *= 2


def count_aged_out(
    store: Any, *, since_ns: int, now: int, horizon_ns: int, max_age_s: float, quiet_s: float | None = None,
    reward_name: str | None = None,
) -> tuple[int, int]:
    """``(aged_out, failed)``: rollouts whose feedback window (``max_age_s`` after completion) closed in
    ``(since_ns, now]`` without a reward, and failed rollouts (stored end with status ERROR) in the same window."""
    params = _params(now, horizon_ns, quiet_s=quiet_s, max_age_s=max_age_s, reward_name=reward_name)
    params["since_ns"] = since_ns
    row = store.sql(_AGED, params).to_pylist()[0]
    return int(row["aged_out"] or 0), int(row["failed"] or 0)


# The live reward of two sets of policy versions (the online trainer's guard: a new version against the
# weights it replaced): per side, the ready rollouts all of whose token calls one of its versions served
# (a rollout that spans a reload belongs to neither), with their combined reward, as _READY takes them.
_VERSION_REWARDS = _ROLLOUT_STATE + """
SELECT CASE WHEN list_contains($new_versions, min_policy_version) THEN 'new' ELSE 'previous' END AS side,
       count(*) AS n, avg(reward) AS mean, coalesce(var_samp(reward), 0.0) AS var, list(reward) AS rewards
FROM st
WHERE NOT failed AND reward IS NOT NULL AND complete_ns IS NOT NULL AND min_policy_version = max_policy_version
  AND first_reward_ns <= complete_ns + $max_age_ns
  AND greatest(complete_ns, first_reward_ns) <= $now_ns - $settle_ns
  AND (list_contains($new_versions, min_policy_version) OR list_contains($previous_versions, min_policy_version))
GROUP BY 1
"""


@dataclass(frozen=True)
class RewardStats:
    """The judged rollouts of a set of policy versions: how many, their mean reward and its sample variance, and the
    rewards themselves (for the guard's winsorizing, ``online/guard.py``; empty when only the summary is
    known)."""

    n: int = 0
    mean: float = 0.0
    var: float = 0.0
    values: tuple[float, ...] = ()


def version_rewards(
    store: Any, *, new_versions: list[int], previous_versions: list[int], now: int, horizon_ns: int, settle_s: float,
    max_age_s: float, quiet_s: float | None = None, reward_name: str | None = None,
) -> tuple[RewardStats, RewardStats]:
    """``(new, previous)``: the live reward of the rollouts served (every token call) by ``new_versions``,
    and by ``previous_versions``, counting those ready at least ``settle_s`` before ``now`` whose spans
    were all ingested after ``horizon_ns`` (rewards combined as in `ready_rollouts`)."""
    params = _params(now, horizon_ns, quiet_s=quiet_s, max_age_s=max_age_s, reward_name=reward_name)
    params.update({"settle_ns": int(settle_s * _NS_PER_S), "new_versions": [int(v) for v in new_versions],
                   "previous_versions": [int(v) for v in previous_versions]})
    sides = {r["side"]: RewardStats(int(r["n"]), float(r["mean"]), float(r["var"]), tuple(r["rewards"]))
             for r in store.sql(_VERSION_REWARDS, params).to_pylist()}
    return sides.get("new", RewardStats()), sides.get("previous", RewardStats())
