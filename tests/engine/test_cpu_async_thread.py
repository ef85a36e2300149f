"""CPU async scheduling: the model step runs on the calling thread (the one whose OpenMP pool loaded
the model) and the next step is planned on the worker, so torch never starts a second CPU thread
pool; outputs equal synchronous stepping."""
from __future__ import annotations

import threading

from deepinfer_core.llm import LLM
from deepinfer_core.sampling_params import SamplingParams


def test_cpu_async_steps_on_the_calling_thread_and_plans_on_the_worker(tiny_v4_dir):
    prompts = [[5 + i, 17, 33 + i, 9] * (3 + i) for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=12)
    llm = LLM(str(tiny_v4_dir), dtype="float32", async_scheduling=True)
    eng = llm.llm_engine
    execute_threads, schedule_threads = set(), set()
    execute, schedule = eng.runner.execute, eng.scheduler.schedule

    def spy_execute(so):
        execute_threads.add(threading.get_ident())
        return execute(so)

    def spy_schedule():
        schedule_threads.add(threading.get_ident())
        return schedule()

    eng.runner.execute, eng.scheduler.schedule = spy_execute, spy_schedule
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert execute_threads == {threading.get_ident()}
    assert len(schedule_threads - {threading.get_ident()}) == 1  # the worker plans the steps in flight
    sync = LLM(str(tiny_v4_dir), dtype="float32", async_scheduling=False)
    assert got == [o.outputs[0].token_ids for o in sync.generate(prompts, params, use_tqdm=False)]
