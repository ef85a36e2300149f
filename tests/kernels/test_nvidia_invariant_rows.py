"""Every nvidia kernel registered ``batch_invariant=True`` comes with a device row check (a batch's row equals
the row run alone). The row checks need a GPU (``deepinfer_nvidia/tests``); this list check does not, so it
runs in CI: a registration added without its row test fails here, not only on the next device session."""
from __future__ import annotations

from deepinfer_nvidia.kernels import IMPLS  # metadata only: imports no triton

INVARIANT = sorted({(op, prov) for op, prov, _target, _supports, *flag in IMPLS if flag and flag[0]})


def test_every_invariant_entry_has_a_row_test():
    """A new ``batch_invariant=True`` registration must come with a row check: in
    ``deepinfer_nvidia/tests/test_batch_invariance.py``, or in the op family's own device test (named here)."""
    covered = {("gemm.fp8_block", "triton_bi"), ("gemm.fp8_block_grouped", "triton_bi"), ("gemm.mxfp4", "triton_bi"),
               ("gemm.dense", "triton_bi"), ("gemm.dense_wide", "triton_bi"),
               ("attention.sparse_sink", "triton_bi"), ("index.scores", "triton_bi"), ("mhc.mix", "triton_bi"),
               ("mhc.collapse", "triton"), ("mhc.expand", "triton"), ("mhc.collapse_norm", "triton"),
               ("norm.rms", "triton"),
               ("norm.rms_unweighted", "triton"), ("rope.interleaved", "triton"),
               ("moe.experts_mxfp4", "triton_bi"), ("moe.experts_fp8", "triton_bi"), ("moe.experts", "triton_bi"),
               ("cache.write_rows", "triton"), ("engram.gather", "triton"), ("engram.gate", "triton"),
               ("engram.hash_ids", "triton"), ("mhc.head_pre", "triton")}
    # row checks in their own files: test_conformance_route_compress.py::test_rows_are_batch_invariant,
    # test_conformance_topk.py::test_topk_graph_and_row_invariance and ::test_candidate_blocks_sets,
    # and test_conformance_norm_rope.py::test_rows_are_batch_invariant (norm.rms_rope, fused and as its parts)
    covered |= {("norm.rms_rope", "triton")}
    # test_conformance_glue_ops.py::test_swiglu_rows_are_batch_invariant_and_graphs_replay and
    # ::test_entry_slot_rows_are_batch_invariant_and_graphs_replay and ::test_engram_window_rows_and_graphs
    covered |= {("moe.clamped_swiglu", "triton"), ("index.entry_slots", "triton"), ("engram.window", "triton")}
    # test_side_stream.py::test_branch_beside_split_k_gemvs_is_bit_equal (the branch's kernels are the same launches)
    covered |= {("stream.side", "aten")}
    covered |= {("moe.route_topk", "triton"), ("moe.route_hash", "triton"), ("compress.softmax_pool", "triton"),
                ("index.topk", "triton"), ("index.candidate_blocks", "triton")}
    # test_conformance_topk.py::test_candidate_mask (forty-second pass)
    covered |= {("index.candidate_mask", "triton")}
    assert set(INVARIANT) == covered
