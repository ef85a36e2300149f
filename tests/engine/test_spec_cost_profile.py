"""cost_table="profile": the engine measures T(R, n) at start on the real model (agreeing tiny V4.1),
then plans with it; outputs stay those of verify-all (greedy, lossless)."""
from __future__ import annotations

from deepinfer_core.llm import LLM
from deepinfer_core.sampling_params import SamplingParams
from deepinfer_core.spec_decode.cost_model import BatchCostModel
from deepinfer_models.deepseek_v41.agreeing_checkpoint import write_agreeing_v41_checkpoint


def test_profiled_cost_table_at_start_covers_every_level_and_stays_lossless(tmp_path):
    lang = write_agreeing_v41_checkpoint(tmp_path)
    spec = {"num_speculative_tokens": 5, "confidence_scheduling": "auto", "cost_table": "profile"}
    llm = LLM(str(tmp_path), dtype="float32", speculative_config=spec, max_num_seqs=2)
    eng = llm.llm_engine
    assert not eng.has_unfinished_requests()  # the profile's requests are gone
    model = eng.confidence.cost_model
    assert isinstance(model, BatchCostModel) and model.fixed and not eng.confidence.explore
    table = model.table()
    assert sorted(table) == [1, 2]  # batch sizes up to max_num_seqs
    for r, row in table.items():
        assert sorted(row) == [r * (1 + k) for k in range(6)]  # every level 0..N drafts per request
        assert all(s > 0 for s in row.values()) and list(row.values()) == sorted(row.values())
    assert eng.spec_decode_stats()["num_drafts"] == 0  # profiling steps are not counted as serving
    prompts = [lang.prompt(12 + 3 * i, start_token=lang.tokens[i]) for i in range(2)]
    params = SamplingParams(temperature=0, max_tokens=20)
    got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                        use_tqdm=False)]
    plain = LLM(str(tmp_path), dtype="float32")
    want = [o.outputs[0].token_ids for o in plain.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                           use_tqdm=False)]
    assert got == want
