"""Step-time model for confidence-scheduled verification: T(R, n), measured, smoothed, stored.

A decode step of ``R`` requests that verifies ``b`` drafts in all feeds ``n = R + b`` tokens. Its
time is the target forward over n rows, logits + verification of n rows, and the proposer's draft
step for R requests (which does not depend on b). Trimming pays only where T grows with b fast
enough next to everything else, so the model is kept per batch size R, as a curve over
``x = b / R`` (verified drafts per request, 0..N):

* **profiled** (``cost_table={R: {n: seconds}}``, or a JSON file of it): full engine steps timed at
  every level ``x = 0..N`` for several R (``profile.py``), median of repeats; between profiled R
  the curves are interpolated linearly in R at equal x, past the largest R extrapolated linearly.
* **online** (no table): every pure decode step is a sample ``(R, b, seconds)`` in cell
  (R bucket = nearest power of two, level = round(b / R)); a cell's value is the median of its
  last ``window`` samples and counts only after ``min_samples`` samples, and a bucket's curve
  needs two such levels, so a few noisy steps cannot make drafts look expensive (the EMA this
  replaces trimmed CPU batch 64 to 0.45 verified drafts per step).

Both fit the curve monotone (pool-adjacent-violators: a step never gets cheaper with more tokens).

File format (``save_cost_table`` / ``load_cost_table``), JSON::

    {"format": "deepinfer-step-cost/1",
     "steps": {"<R>": {"<n tokens>": <seconds>, ...}, ...},
     "meta": {...free-form: platform, dtype, threads, model, repeats...}}

A plain ``{"<n tokens>": seconds}`` map is the older one-dimensional table (``confidence.StepCostModel``).
"""
from __future__ import annotations

import bisect
import json
import statistics
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

FORMAT = "deepinfer-step-cost/1"


def monotone_fit(ys: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """Least-squares non-decreasing fit of ``ys`` (in x order): pool-adjacent-violators.

    ys: values at increasing x; weights: per value (e.g. sample counts), default 1. Returns a list
    of the same length whose runs are the weighted means of the pooled blocks.
    """
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for y, w in zip(ys, weights or [1.0] * len(ys)):
        blocks.append([float(y), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    out: list[float] = []
    for m, _, c in blocks:
        out.extend([m] * c)
    return out


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys) (xs increasing, ys non-decreasing); flat below the first
    point, the last slope extended above the last (never negative)."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    i = bisect.bisect_left(xs, x)
    lo, hi = (i - 1, i) if i < len(xs) else (len(xs) - 2, len(xs) - 1)
    slope = max((ys[hi] - ys[lo]) / (xs[hi] - xs[lo]), 0.0)
    return ys[lo] + slope * (x - xs[lo])


def _bucket(requests: int) -> int:
    """Nearest power of two (the online model's R bucket; 3 -> 4, 5 -> 4, 6 -> 8)."""
    lo = 1 << (requests.bit_length() - 1)
    return lo if requests - lo < 2 * lo - requests else 2 * lo


class BatchCostModel:
    """T(R, n) in seconds: fixed from a profiled table, or learned online (module docstring).

    table: ``{R: {n: seconds}}`` with n >= R (R requests, n - R verified drafts) or None (online).
    window / min_samples: the online cells' sample window and the samples a cell needs to count.
    """

    def __init__(self, table: Mapping[int, Mapping[int, float]] | None = None, window: int = 16,
                 min_samples: int = 3):
        self.fixed = table is not None
        self.window = window
        self.min_samples = min_samples
        self._lock = threading.Lock()  # observed on the stepping thread, read for stats elsewhere
        self._cells: dict[int, dict[int, deque]] = {}
        self._curves: dict[int, tuple[list[float], list[float]]] = {}  # R -> (x levels, fitted seconds)
        if table is not None:
            for r, row in table.items():
                r = int(r)
                pts = sorted(((int(n) - r) / r, float(s)) for n, s in row.items())
                if r < 1 or not pts or pts[0][0] < 0:
                    raise ValueError(f"cost table: batch {r} needs token counts >= {r}, got {sorted(row)}")
                self._curves[r] = ([x for x, _ in pts], monotone_fit([y for _, y in pts]))

    # -- online ------------------------------------------------------------
    def observe_step(self, requests: int, drafts: int, seconds: float) -> None:
        """A pure decode step: ``requests`` decoding requests verified ``drafts`` drafts in ``seconds``."""
        if self.fixed or requests < 1 or drafts < 0 or not seconds > 0:
            return
        level = round(drafts / requests)
        with self._lock:
            cell = self._cells.setdefault(_bucket(requests), {}).setdefault(level, deque(maxlen=self.window))
            cell.append(seconds)

    def samples(self, requests: int, level: int) -> int:
        """Online samples in the cell of (``requests``' bucket, ``level``)."""
        with self._lock:
            return len(self._cells.get(_bucket(requests), {}).get(level, ()))

    def _online_curve(self, bucket: int) -> tuple[list[float], list[float]] | None:
        with self._lock:
            cells = {k: list(v) for k, v in self._cells.get(bucket, {}).items() if len(v) >= self.min_samples}
        if len(cells) < 2:
            return None
        levels = sorted(cells)
        fitted = monotone_fit([statistics.median(cells[k]) for k in levels], [len(cells[k]) for k in levels])
        return [float(k) for k in levels], fitted

    # -- queries -----------------------------------------------------------
    def step_cost(self, requests: int, tokens: int) -> float | None:
        """Predicted seconds of a step of ``requests`` decoding requests and ``tokens`` >= requests
        tokens; None while the model knows too little (online: no curve for this bucket yet)."""
        if requests < 1:
            return None
        x = max(tokens - requests, 0) / requests
        if not self.fixed:
            curve = self._online_curve(_bucket(requests))
            return None if curve is None else _interp(*curve, x)
        rs = sorted(self._curves)
        if requests <= rs[0]:
            return _interp(*self._curves[rs[0]], x)
        i = bisect.bisect_left(rs, requests)
        lo, hi = (rs[i - 1], rs[i]) if i < len(rs) else (rs[-2], rs[-1]) if len(rs) > 1 else (rs[0], rs[0])
        if lo == hi:  # one profiled batch size: scale nothing, the curve is all we know
            return _interp(*self._curves[lo], x)
        t_lo, t_hi = _interp(*self._curves[lo], x), _interp(*self._curves[hi], x)
        t = t_lo + (t_hi - t_lo) * (requests - lo) / (hi - lo)
        return max(t, t_hi) if requests > hi else t

    def table(self) -> dict[int, dict[int, float]]:
        """The fitted model as ``{R: {n: seconds}}`` (the file format's ``steps``; online: buckets
        whose curve is known)."""
        if self.fixed:
            curves = self._curves
        else:
            with self._lock:
                buckets = sorted(self._cells)
            curves = {b: c for b in buckets if (c := self._online_curve(b)) is not None}
        return {r: {round(r * (1 + x)): y for x, y in zip(xs, ys)} for r, (xs, ys) in sorted(curves.items())}


def save_cost_table(path: str | Path, steps: Mapping[int, Mapping[int, float]], meta: dict | None = None) -> None:
    """Write a profiled table (``{R: {n: seconds}}``) in the documented JSON format."""
    body = {"format": FORMAT, "steps": {str(r): {str(n): float(s) for n, s in sorted(row.items())}
                                        for r, row in sorted(steps.items())}, "meta": meta or {}}
    Path(path).write_text(json.dumps(body, indent=1) + "\n")


def parse_cost_table(raw) -> dict:
    """JSON value -> ``{R: {n: s}}`` (profiled format) or ``{n: s}`` (one-dimensional)."""
    if isinstance(raw, Mapping) and "steps" in raw:
        if raw.get("format", FORMAT) != FORMAT:
            raise ValueError(f"unknown cost table format {raw.get('format')!r} (expected {FORMAT!r})")
        return {int(r): {int(n): float(s) for n, s in row.items()} for r, row in raw["steps"].items()}
    if isinstance(raw, Mapping) and raw and all(isinstance(v, Mapping) for v in raw.values()):
        return {int(r): {int(n): float(s) for n, s in row.items()} for r, row in raw.items()}
    return {int(k): float(v) for k, v in raw.items()}


def is_batched_table(table) -> bool:
    """True for ``{R: {n: s}}`` (profiled), False for ``{n: s}``."""
    return bool(table) and all(isinstance(v, Mapping) for v in table.values())
