"""The step-time model behind confidence-scheduled verification (spec_decode/cost_model.py) and the
"auto" decision built on it: monotone fits, profiled tables through their JSON file, batch-size
interpolation, online cells that noise cannot collapse, probes, and trim-only-on-a-gain."""
from __future__ import annotations

import json

import pytest

from deepinfer_core.spec_decode.confidence import AUTO_MARGIN, ConfidenceScheduler
from deepinfer_core.spec_decode.config import SpeculativeConfig
from deepinfer_core.spec_decode.cost_model import BatchCostModel, monotone_fit, save_cost_table

N = 5
# confidences of 4 requests: early drafts likely, late ones not (survival falls along each request)
CONF = {f"r{i}": [0.95, 0.9, 0.6, 0.3, 0.2] for i in range(4)}
ORDER = list(CONF)


def _table(per_draft: float, base: float = 1.0, batches=(1, 4, 16)) -> dict[int, dict[int, float]]:
    """T(R, R + b) = base * R + per_draft * b, at every level k = 0..N."""
    return {r: {r * (1 + k): base * r + per_draft * k * r for k in range(N + 1)} for r in batches}


def test_monotone_fit_pools_violators_and_keeps_sorted_input():
    assert monotone_fit([1.0, 3.0, 2.0, 4.0]) == pytest.approx([1.0, 2.5, 2.5, 4.0])
    assert monotone_fit([5.0, 1.0, 1.0]) == pytest.approx([7 / 3] * 3)
    assert monotone_fit([1.0, 3.0, 2.0], weights=[1, 1, 3]) == pytest.approx([1.0, 2.25, 2.25])
    assert monotone_fit([0.1, 0.2, 0.2, 0.5]) == [0.1, 0.2, 0.2, 0.5]  # already monotone: unchanged


def test_profiled_table_is_fitted_interpolated_and_extrapolated():
    # one noisy dip at R=1, level 3: fitted monotone (a step never gets cheaper with more drafts)
    t = _table(0.5)
    t[1][4] = 0.5
    m = BatchCostModel(t)
    fitted = m.table()[1]
    assert list(fitted.values()) == pytest.approx([1.0, 4 / 3, 4 / 3, 4 / 3, 3.0, 3.5])
    assert m.step_cost(1, 1) == pytest.approx(1.0) and m.step_cost(1, 6) == pytest.approx(3.5)
    # R=10 between profiled 4 and 16, at 2 drafts per request: linear in R at equal x
    assert m.step_cost(10, 30) == pytest.approx(8.0 + (32.0 - 8.0) * (10 - 4) / (16 - 4))
    assert m.step_cost(32, 32) >= m.step_cost(16, 16)  # past the largest batch: extrapolated, never cheaper
    assert m.step_cost(16, 16 + 80) > m.step_cost(16, 16 + 40) > m.step_cost(16, 16)


def test_profiled_table_round_trips_through_its_json_file(tmp_path):
    t = _table(0.25)
    path = tmp_path / "cost.json"
    save_cost_table(path, t, meta={"platform": "cpu", "threads": 2})
    raw = json.loads(path.read_text())
    assert raw["format"] == "deepinfer-step-cost/1" and raw["meta"]["threads"] == 2
    assert raw["steps"]["4"]["8"] == pytest.approx(5.0)
    cfg = SpeculativeConfig.from_user({"cost_table": str(path)})
    assert cfg.cost_table == t
    assert BatchCostModel(cfg.cost_table).table() == t  # already monotone: the model keeps it exactly
    assert SpeculativeConfig.from_user({"cost_table": {str(r): {str(n): s for n, s in row.items()}
                                                       for r, row in t.items()}}).cost_table == t
    assert SpeculativeConfig.from_user({"cost_table": "profile"}).cost_table == "profile"
    with pytest.raises(ValueError, match="cost_table"):
        SpeculativeConfig.from_user({"cost_table": {4: {8: -1.0}}})
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other/9", "steps": {}}))
    with pytest.raises(ValueError, match="unknown cost table format"):
        SpeculativeConfig.from_user({"cost_table": str(tmp_path / "bad.json")})


def test_auto_verifies_everything_on_a_flat_table_and_trims_when_drafts_cost():
    flat = ConfidenceScheduler(N, BatchCostModel(_table(0.0)), margin=AUTO_MARGIN)
    assert flat.plan(CONF, ORDER, 4) == dict.fromkeys(ORDER, 5)
    # nearly flat: trimming gains a little (< the margin), so "auto" still verifies everything ...
    nearly = _table(0.015)
    assert ConfidenceScheduler(N, BatchCostModel(nearly), margin=AUTO_MARGIN).plan(CONF, ORDER, 4) == \
        dict.fromkeys(ORDER, 5)
    # ... while True (margin 0) takes any predicted gain
    forced = ConfidenceScheduler(N, BatchCostModel(nearly)).plan(CONF, ORDER, 4)
    assert sum(forced.values()) < 20
    # step time grows with tokens: the unlikely tail (survival <= 0.17) is cut, the likely head kept
    steep = ConfidenceScheduler(N, BatchCostModel(_table(0.25)), margin=AUTO_MARGIN)
    plan = steep.plan(CONF, ORDER, 4)
    assert plan == dict.fromkeys(ORDER, 3)
    assert steep.last_step == (4, 12, 4)


def test_online_model_needs_samples_and_ignores_outliers():
    m = BatchCostModel(min_samples=3)
    for s in (1.0, 1.1, 0.9):
        m.observe_step(8, 40, s)  # level 5
    assert m.step_cost(8, 48) is None  # one level only: no curve, every draft is verified
    m.observe_step(8, 16, 0.8)
    m.observe_step(8, 16, 0.8)
    assert m.step_cost(8, 48) is None  # level 2 has 2 < 3 samples
    m.observe_step(8, 16, 50.0)  # a preempted step: one sample must not make drafts look expensive
    m.observe_step(8, 16, 0.8)
    assert m.step_cost(8, 24) == pytest.approx(0.8)
    assert m.step_cost(8, 48) == pytest.approx(1.0)
    assert m.step_cost(7, 42) == pytest.approx(1.0)  # same bucket (8)
    assert m.step_cost(2, 10) is None  # another bucket: unknown
    assert m.table() == {8: {24: pytest.approx(0.8), 48: pytest.approx(1.0)}}
    m.observe_step(8, 40, 0.1)  # cheaper at more drafts (noise): the fit stays monotone
    m.observe_step(8, 40, 0.1)
    m.observe_step(8, 40, 0.1)
    lo, hi = m.table()[8].values()
    assert lo <= hi


def test_online_scheduler_probes_then_decides_and_noise_cannot_collapse_the_budget():
    model = BatchCostModel(min_samples=3)
    sched = ConfidenceScheduler(N, model, margin=AUTO_MARGIN, explore=True, probe_every=2)
    budgets = []
    for step in range(12):  # a flat platform: every step costs 1.0 +- noise whatever is verified
        plan = sched.plan(CONF, ORDER, 4)
        budgets.append(sum(plan.values()))
        sched.observe_step(1.0 + 0.05 * ((step * 7) % 3 - 1))
    assert sched.num_probes == 3  # until the probe level has min_samples, one step in probe_every
    assert 8 in budgets[:6]  # a probe verifies N // 2 = 2 drafts per request (the best ones)
    assert budgets[-4:] == [20] * 4  # the curve is flat: no predicted gain, verify everything
    # a burst of slow full steps (another process on the cores) cannot collapse b: medians hold
    for _ in range(2):
        sched.plan(CONF, ORDER, 4)
        sched.observe_step(9.0)
    assert sum(sched.plan(CONF, ORDER, 4).values()) == 20


def test_steps_with_prefill_tokens_are_not_decode_samples():
    model = BatchCostModel(min_samples=1)
    sched = ConfidenceScheduler(N, model, explore=True)
    sched.plan(CONF, ORDER, 4 + 100)  # 100 prefill tokens ride along
    sched.observe_step(5.0)
    assert model.samples(4, 5) == 0
    sched.plan(CONF, ORDER, 4)
    sched.observe_step(1.0)
    assert model.samples(4, 5) == 1
    sched.observe_step(1.0)  # no plan since: nothing observed twice
    assert model.samples(4, 5) == 1
