"""Measure the step-time table T(R, n) on the actual model and platform.

For each batch size R: R synthetic greedy requests decode with DSpark until every one carries
drafts, then for each level k = 0..N the confidence scheduler is forced to verify exactly k
drafts per request (the best by survival) for ``warmup + repeats`` full engine steps (target
forward, logits, verification, the next draft step: what a real step costs); the median of the
timed steps at exactly (R, k*R) is ``T(R, R*(1+k))``. Medians because the CPU is shared with
whatever else runs: one preempted step must not move the table.

Used by ``speculative_config={"cost_table": "profile"}`` (at engine start) and by
``benchmarks/spec_decode.py --profile PATH`` (writes the JSON, ``cost_model.save_cost_table``).
"""
from __future__ import annotations

import statistics
import time

from deepinfer_core.sampling_params import SamplingParams

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def profile_step_costs(engine, batch_sizes=DEFAULT_BATCH_SIZES, repeats: int = 5, warmup: int = 2,
                       prompt_len: int = 16) -> dict[int, dict[int, float]]:
    """Time engine steps at every (R, verified drafts per request) -> ``{R: {n tokens: seconds}}``.

    engine: an idle LLMEngine with confidence scheduling (``engine.confidence`` not None); batch
    sizes above its ``max_num_seqs`` are skipped. Leaves the engine idle, its cost model untouched.
    """
    conf = engine.confidence
    if conf is None:
        raise ValueError("profiling step costs needs speculative decoding with a confidence head")
    if engine.has_unfinished_requests():
        raise ValueError("profile_step_costs needs an idle engine")
    n, vocab = conf.n, engine.vocab_size
    per_level = warmup + repeats
    # every level must be reachable without nearing max_tokens (the scheduler then caps drafts)
    max_tokens = min(engine.config.max_model_len - prompt_len - 2 * (n + 1), (n + 1) * (per_level + 4) * (n + 1))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    table: dict[int, dict[int, float]] = {}
    rec: list[tuple[int, int, int, float]] = []
    conf.recorder, saved_level = rec, conf.force_level
    try:
        for r in sorted(b for b in batch_sizes if b <= engine.config.max_num_seqs):
            ids = [f"__profile_{r}_{i}" for i in range(r)]
            for i, rid in enumerate(ids):  # distinct prompts: no prefix-cache sharing between requests
                prompt = [3 + (97 * i + 31 * j + r) % (vocab - 3) for j in range(prompt_len)]
                engine.add_request(rid, {"prompt_token_ids": prompt}, params, arrival=time.monotonic())
            conf.force_level = n
            for _ in range(64):  # prefill, then until a step verifies drafts of all r requests
                engine.step()
                if any(rr == r and b == n * r for rr, b, _, _ in rec):
                    break
            row = {}
            for k in range(n + 1):
                conf.force_level = k
                rec.clear()
                for _ in range(per_level + 2):  # + the steps planned before the level took effect
                    engine.step()
                times = [s for rr, b, base, s in rec if rr == r and b == k * r and base == r][warmup:]
                if times:
                    row[r * (1 + k)] = statistics.median(times)
            if row:
                table[r] = row
            for rid in ids:
                engine.abort_request(rid)
            while engine.has_unfinished_requests():
                engine.step()
    finally:
        conf.recorder, conf.force_level = None, saved_level
        conf.last_step = None
    return table
