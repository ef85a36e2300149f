"""``benchmarks/chain_census.py``: one decode step's ops of the tiny V4.1, on the main stream or in branches."""
from __future__ import annotations

from benchmarks.chain_census import census, report


def test_census_of_the_default_step():
    calls = census()
    chain = [op for op, side in calls if not side]
    side = [op for op, side in calls if side]
    # every sublayer's mix runs as a branch (V4.1's delayed mHC), the shared experts too; the boundary is the chain
    assert side.count("mhc.mix") == chain.count("mhc.expand") == 20 and "mhc.mix" not in chain
    # the router and the MXFP4 experts are one op (a platform may lay out the routing as it routes)
    assert side.count("moe.clamped_swiglu") == chain.count("moe.topk_experts_mxfp4") == 10
    assert not {"moe.router_topk", "moe.experts_mxfp4", "gemm.dense_wide"} & set(chain)
    text = report(calls, layers_shown=1)
    assert text.startswith(f"decode step: {len(chain)} ops on the main stream, {len(side)} in side branches")
    assert "chain order: " in text and text.count("attention.sparse_sink_rope") >= 2
