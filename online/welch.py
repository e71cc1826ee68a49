"""Welch's one-sided t-test: is a new policy's mean reward worse than the previous one's by more than a margin?

The online guard (``guard.py``, beside it) rolls an update back on it. Student's t tail comes
from the regularized incomplete beta function (``P(T > t) = I_{df / (df + t^2)}(df / 2, 1 / 2) / 2``),
evaluated by its continued fraction, so no SciPy is needed.
"""

from __future__ import annotations

import math
from typing import Protocol

__all__ = ["Sample", "t_sf", "worse_p_value"]


class Sample(Protocol):
    """A side's summary: ``n`` rewards with mean ``mean`` and unbiased variance ``var``."""

    n: int
    mean: float
    var: float


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((qam + 2 * m) * (a + 2 * m)),
                          -(a + m) * (qab + m) * x / ((a + 2 * m) * (qap + 2 * m))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def worse_p_value(previous: Sample, new: Sample, margin: float) -> float:
    """Welch's one-sided p-value of H0 ``new.mean >= previous.mean - margin`` (each side needs n >= 2):
    ``t = (previous.mean - new.mean - margin) / sqrt(previous.var / previous.n + new.var / new.n)`` on the
    Welch-Satterthwaite degrees of freedom. No spread on either side: 0 when the gap exceeds the margin, else 1."""
    a, b = previous.var / previous.n, new.var / new.n
    gap = previous.mean - new.mean - margin
    if a + b <= 0.0:
        return 0.0 if gap > 0 else 1.0
    df = (a + b) ** 2 / (a * a / (previous.n - 1) + b * b / (new.n - 1))
    return t_sf(gap / math.sqrt(a + b), df)
