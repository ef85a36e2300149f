"""Confidence-scheduled verification (ENGINE_FEATURES.md 1.6).

Per request r the confidence head gives ``c_{r,k}`` = P(draft k accepted | drafts < k accepted);
survival ``S_{r,k} = prod_{j<=k} c_{r,j}`` = P(first k drafts accepted) is non-increasing in k,
so the global top-b survival values give every request a *prefix* of its drafts and maximise
the expected accepted drafts for b verified ones. b is chosen to maximise expected tokens per
second, ``(R + sum_top_b S) / T(R, base + b)``, with ``T`` the step-time model
(``cost_model.BatchCostModel``, or the one-dimensional ``StepCostModel`` below), and the plan
trims only when that beats verifying everything by ``margin`` (``AUTO_MARGIN`` under
``confidence_scheduling="auto"``). Verifying fewer drafts never changes which tokens are correct
(verification is lossless for any prefix).
"""
from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping, Sequence

# "auto" trims only where the model predicts >= 5% more tokens per second than verifying every
# draft: below that the prediction is within the step-time noise measured on the CPU
# (docs/speculative_decoding.md), and a wrong trim loses accepted tokens for nothing.
AUTO_MARGIN = 0.05


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

    def step_cost(self, requests: int, tokens: int) -> float | None:
        """The batch-aware query (``BatchCostModel``'s): this table ignores the batch size."""
        return self.cost(tokens)


class ConfidenceScheduler:
    """Chooses how many drafts each request verifies this step.

    margin: trim only when the predicted tokens/s beats verify-all by this fraction (0: any gain).
    explore: the cost model learns online; while it cannot price a step of this batch size, one
      step in ``probe_every`` verifies ``N // 2`` drafts per request (the best by survival) so the
      model sees a second level; every other step verifies all.
    force_level / recorder: profiling (``profile.py``): verify exactly this many drafts per request /
      append ``(requests, verified drafts, other tokens, seconds)`` of every observed step.
    """

    def __init__(self, num_draft_tokens: int, cost_model, min_batch: int = 1, margin: float = 0.0,
                 explore: bool = False, probe_every: int = 4):
        self.n = num_draft_tokens
        self.cost_model = cost_model
        self.min_batch = min_batch
        self.margin = margin
        self.explore = explore
        self.probe_every = probe_every
        self.last_budget: int | None = None
        self.last_step: tuple[int, int, int] | None = None  # (requests, verified drafts, other tokens) planned
        self.force_level: int | None = None
        self.recorder: list[tuple[int, int, int, float]] | None = None
        self.num_probes = 0
        self._since_probe = 0

    def plan(self, confidences: Mapping[str, Sequence[float]], order: Sequence[str], base_tokens: int
             ) -> dict[str, int]:
        """confidences[rid]: c_1..c_L of the drafts request ``rid`` holds (L <= N); ``order``: the
        requests in batch order (tie-break); base_tokens: the step's tokens besides drafts (one
        anchor per decoding request, prefill chunks). Returns drafts to verify per request."""
        out = self._plan(confidences, order, base_tokens)
        self.last_budget = sum(out.values())
        self.last_step = (len(order), self.last_budget, base_tokens)
        return out

    def _plan(self, confidences, order, base_tokens) -> dict[str, int]:
        full = {rid: len(confidences[rid]) for rid in order}
        total, r = sum(full.values()), len(order)
        if self.force_level is not None:
            return select_top(confidences, order, self.force_level * r)
        if r < self.min_batch or total == 0:
            return full

        def cost(b: int) -> float | None:
            return self.cost_model.step_cost(r, base_tokens + b)

        if cost(total) is None:
            return self._probe_or_full(confidences, order, full)
        items = _ranked(confidences, order)
        best_b, best_theta, acc = 0, r / cost(0), 0.0
        for b, (neg_s, _, _, _) in enumerate(items, start=1):
            acc -= neg_s
            theta = (r + acc) / cost(b)
            if theta > best_theta:
                best_b, best_theta = b, theta
        if best_b == total or best_theta <= (1 + self.margin) * (r + acc) / cost(total):
            return full  # no predicted gain worth the risk: verify every draft
        return select_top(confidences, order, best_b)

    def _probe_or_full(self, confidences, order, full) -> dict[str, int]:
        """Online model without a curve for this batch size: mostly verify all, sometimes a probe."""
        level = max(self.n // 2, 1)
        samples = getattr(self.cost_model, "samples", None)
        if not self.explore or samples is None or samples(len(order), level) >= self.cost_model.min_samples:
            return full
        self._since_probe += 1
        if self._since_probe < self.probe_every:
            return full
        self._since_probe = 0
        self.num_probes += 1
        return select_top(confidences, order, level * len(order))

    def observe_step(self, seconds: float) -> None:
        """The step planned last took ``seconds`` (called on the stepping thread right after it)."""
        step, self.last_step = self.last_step, None
        if step is None:
            return
        r, b, base = step
        if self.recorder is not None:
            self.recorder.append((r, b, base, seconds))
        if base != r:  # prefill chunks rode along: not a pure decode sample
            return
        observe = getattr(self.cost_model, "observe_step", None)
        if observe is not None:
            observe(r, b, seconds)
        else:
            self.cost_model.observe(base + b, seconds)


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
