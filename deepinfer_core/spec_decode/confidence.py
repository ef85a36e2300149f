"""Confidence-scheduled verification (ENGINE_FEATURES.md 1.6).

Per request r the confidence head gives ``c_{r,k}`` = P(draft k accepted | drafts < k accepted);
survival ``S_{r,k} = prod_{j<=k} c_{r,j}`` = P(first k drafts accepted) is non-increasing in k,
so the global top-b survival values give every request a *prefix* of its drafts and maximise
the expected accepted drafts for b verified ones. b is chosen to maximise expected tokens per
second, ``(R + sum_top_b S) / T(base + b)``, with ``T`` the step-time model. Verifying fewer
drafts never changes which tokens are correct (verification is lossless for any prefix).
"""
from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping, Sequence


def survival(confidence: Sequence[float]) -> list[float]:
    """c_1..c_N -> S_1..S_N (running products)."""
    out, s = [], 1.0
    for c in confidence:
        s *= min(max(float(c), 0.0), 1.0)
        out.append(s)
    return out


class StepCostModel:
    """Step time (s) as a function of the step's token count.

    ``table``: a fixed {tokens: seconds} map (deterministic budgets; made monotone, linearly
    interpolated, extrapolated by the last slope). Without it the model learns online: an EMA
    per power-of-two bucket of measured steps; unknown until a bucket and a neighbour exist.
    """

    def __init__(self, table: Mapping[int, float] | None = None, alpha: float = 0.25):
        self.fixed = table is not None
        self.alpha = alpha
        self._points: dict[int, float] = dict(table) if table else {}
        self._lock = threading.Lock()  # observed on the step worker, read by the scheduler

    def observe(self, tokens: int, seconds: float) -> None:
        if self.fixed or tokens < 1 or not seconds > 0:
            return
        b = 1 << (tokens - 1).bit_length()  # bucket: next power of two
        with self._lock:
            old = self._points.get(b)
            self._points[b] = seconds if old is None else (1 - self.alpha) * old + self.alpha * seconds

    def table(self) -> dict[int, float]:
        with self._lock:
            return dict(sorted(self._points.items()))

    def cost(self, tokens: int) -> float | None:
        """Predicted seconds for a step of ``tokens`` tokens; None while unknown."""
        pts = sorted(self.table().items())
        if len(pts) < (1 if self.fixed else 2):
            return None
        xs, ys, best = [], [], 0.0
        for x, y in pts:  # running max: a step never gets cheaper with more tokens
            best = max(best, y)
            xs.append(x)
            ys.append(best)
        if len(xs) == 1:
            return ys[0]
        i = bisect.bisect_left(xs, tokens)
        if i < len(xs) and xs[i] == tokens:
            return ys[i]
        if i == 0:
            return ys[0]
        lo, hi = (i - 1, i) if i < len(xs) else (len(xs) - 2, len(xs) - 1)
        slope = (ys[hi] - ys[lo]) / (xs[hi] - xs[lo])
        return max(ys[lo] + slope * (tokens - xs[lo]), ys[0])


class ConfidenceScheduler:
    """Chooses how many drafts each request verifies this step."""

    def __init__(self, num_draft_tokens: int, cost_model: StepCostModel, min_batch: int = 1):
        self.n = num_draft_tokens
        self.cost_model = cost_model
        self.min_batch = min_batch
        self.last_budget: int | None = None

    def plan(self, confidences: Mapping[str, Sequence[float]], order: Sequence[str], base_tokens: int
             ) -> dict[str, int]:
        """confidences[rid]: c_1..c_L of the drafts request ``rid`` holds (L <= N); ``order``: the
        requests in batch order (tie-break); base_tokens: the step's tokens besides drafts (one
        anchor per decoding request, prefill chunks). Returns drafts to verify per request."""
        full = {rid: len(confidences[rid]) for rid in order}
        total = sum(full.values())
        if len(order) < self.min_batch or total == 0 or self.cost_model.cost(base_tokens + total) is None:
            self.last_budget = total
            return full
        items = _ranked(confidences, order)
        r = len(order)
        best_b, best_theta, acc = 0, r / self.cost_model.cost(base_tokens), 0.0
        for b, (neg_s, _, _, _) in enumerate(items, start=1):
            acc -= neg_s
            theta = (r + acc) / self.cost_model.cost(base_tokens + b)
            if theta > best_theta:
                best_b, best_theta = b, theta
        self.last_budget = best_b
        return select_top(confidences, order, best_b)


def _ranked(confidences: Mapping[str, Sequence[float]], order: Sequence[str]) -> list[tuple]:
    """Every (request, draft) slot, best survival first; ties by position, then batch order
    (value-independent, so every caller ranks identically)."""
    items = []
    for ri, rid in enumerate(order):
        for k, s in enumerate(survival(confidences[rid])):
            items.append((-s, k, ri, rid))
    items.sort()
    return items


def select_top(confidences: Mapping[str, Sequence[float]], order: Sequence[str], budget: int) -> dict[str, int]:
    """Drafts per request when only the ``budget`` best survival slots are verified (a prefix of each
    request's drafts, since survival never grows along a request's drafts)."""
    out = dict.fromkeys(order, 0)
    for _, _, _, rid in _ranked(confidences, order)[:max(budget, 0)]:
        out[rid] += 1
    return out
