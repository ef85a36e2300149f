"""NVIDIA kernel implementations, registered lazily into core's KernelRegistry.

Each entry of :data:`IMPLS` is ``(op, provider, "module:attr", supports)``:
metadata only. Nothing under this package is imported until the registry
resolves an op to one of these providers, so registering never imports triton.
One provider family per module (``triton_norm.py``, ``flashmla.py``, ...).

Providers, tried in this order by default: ``triton`` (Triton kernels, one module per op family),
``triton_bi`` (batch-invariant launches of those kernels: tile shapes and
splits fixed or taken from the weight shape, never from the number of rows;
used only in batch-invariant mode, see ``NvidiaPlatform.default_providers``)
and ``aten`` (vendor libraries through torch's CUDA operators: cuBLAS, CUTLASS
grouped GEMM). Ops listed nowhere here run core's reference on the device.

The fifth element marks a provider batch-invariant (docs/determinism.md): each
output row's bits do not depend on how many rows the call holds or where the
row sits. A ``triton`` kernel is marked when its default launch already is (one
program per row or token, or tiles that do not depend on the row count);
otherwise its ``triton_bi`` entry is the invariant one.
"""
from __future__ import annotations

from typing import Any

# (op, provider, target, supports-target or None[, batch_invariant]). Providers are tried in the
# order of NvidiaPlatform.default_providers.
_K = "deepinfer_nvidia.kernels"
IMPLS: tuple[tuple, ...] = (
    # batch-invariant as launched: one program per row (norm), per element (rope), per token and
    # D tile (mhc.collapse / mhc.expand), per token (mhc.collapse_norm)
    ("norm.rms", "triton", f"{_K}.triton_norm:rms", f"{_K}.triton_norm:supports_rms", True),
    ("norm.rms_unweighted", "triton", f"{_K}.triton_norm:rms_unweighted", f"{_K}.triton_norm:supports_rms_unweighted",
     True),
    ("rope.interleaved", "triton", f"{_K}.triton_rope:rope", f"{_K}.triton_rope:supports", True),
    # one program a vector, on or off (DEEPINFER_NV_NORM_ROPE_FUSED=0 runs its parts; both are invariant)
    ("norm.rms_rope", "triton", f"{_K}.triton_rope:rms_rope", f"{_K}.triton_rope:supports_rms_rope", True),
    ("index.topk", "triton", f"{_K}.triton_topk:topk_positions_triton", f"{_K}.triton_topk:supports", True),
    ("index.candidate_blocks", "triton", f"{_K}.triton_topk:candidate_blocks_triton",
     f"{_K}.triton_topk:supports_candidates", True),
    # a -inf fill and one copy of the listed blocks, per row (12 torch launches in the reference)
    ("index.candidate_mask", "triton", f"{_K}.triton_candidate_mask:candidate_mask_triton",
     f"{_K}.triton_candidate_mask:supports_candidate_mask", True),
    # exact integer gather, one program per (row, selection block)
    ("index.entry_slots", "triton", f"{_K}.triton_entry_slots:entry_slots", f"{_K}.triton_entry_slots:supports",
     True),
    ("moe.route_topk", "triton", f"{_K}.triton_route:route_topk", f"{_K}.triton_route:supports_route", True),
    # elementwise (the shared expert's activation, one launch instead of five)
    ("moe.clamped_swiglu", "triton", f"{_K}.triton_swiglu:clamped_swiglu", f"{_K}.triton_swiglu:supports", True),
    ("moe.route_hash", "triton", f"{_K}.triton_route:route_hash", f"{_K}.triton_route:supports_hash", True),
    ("compress.softmax_pool", "triton", f"{_K}.triton_compress:softmax_pool", f"{_K}.triton_compress:supports_pool",
     True),
    # a ratio-2 compressor's decode step in one launch (the model's default; DEEPINFER_COMPRESS_RING_POOL=0: off)
    ("compress.ring_pair_pool", "triton", f"{_K}.triton_compress:ring_pair_pool",
     f"{_K}.triton_compress:supports_ring_pair"),
    # a compressor's entries (norm, cast, group starts, RoPE, cache store) in one launch; not flagged, so
    # batch-invariant mode composes it from the flagged parts (their bits, as before the op)
    ("compress.entry_write", "triton", f"{_K}.triton_compress_entry:entry_write",
     f"{_K}.triton_compress_entry:supports"),
    ("mhc.collapse", "triton", f"{_K}.triton_mhc:collapse", f"{_K}.triton_mhc:supports_collapse", True),
    ("mhc.expand", "triton", f"{_K}.triton_mhc:expand", f"{_K}.triton_mhc:supports_expand", True),
    ("mhc.collapse_norm", "triton", f"{_K}.triton_mhc:collapse_norm", f"{_K}.triton_mhc:supports_collapse_norm",
     True),
    ("mhc.head_pre", "triton", f"{_K}.triton_mhc:head_pre", f"{_K}.triton_mhc:supports_head", True),
    # Engram: one program per table row (gather) or per token (gate, fixed reduction order)
    ("engram.gather", "triton", f"{_K}.triton_engram:gather", f"{_K}.triton_engram:supports_gather", True),
    ("engram.gate", "triton", f"{_K}.triton_engram:gate", f"{_K}.triton_engram:supports_gate", True),
    ("engram.window", "triton", f"{_K}.triton_engram_window:window", f"{_K}.triton_engram_window:supports", True),
    # exact integer hashing, one program per (token, layer)
    ("engram.hash_ids", "triton", f"{_K}.triton_engram_hash:hash_ids", f"{_K}.triton_engram_hash:supports_hash",
     True),
    # a masked row copy (every KV / state cache write): no reduction, each element stored on its own
    ("cache.write_rows", "triton", f"{_K}.triton_cache:write_rows", f"{_K}.triton_cache:supports", True),
    # exact integer index math, but not flagged (no row test): batch-invariant mode runs the references
    ("kv.sliding_slots", "triton", f"{_K}.triton_kv:sliding_slots", f"{_K}.triton_kv:supports_sliding"),
    ("kv.compressed_slots", "triton", f"{_K}.triton_kv:compressed_slots", f"{_K}.triton_kv:supports_compressed"),
    # not invariant: tiles / splits chosen from the row count, cuBLAS or grouped_mm above a size (the sampler
    # filter: the reference below triton_sampling.MIN_ROWS rows, the kernel above; masks agree except within
    # fp32 rounding of a top-p / min-p boundary)
    ("sample.topk_topp_minp", "triton", f"{_K}.triton_sampling:topk_topp_minp",
     f"{_K}.triton_sampling:supports_filters"),
    ("attention.sparse_sink", "triton", f"{_K}.triton_attention:sparse_sink", f"{_K}.triton_attention:supports"),
    # q's RoPE and the output's inverse RoPE fused into the attention launches (opt-in: DEEPINFER_NV_ATTN_ROPE_FUSED=1)
    ("attention.sparse_sink_rope", "triton", f"{_K}.triton_attention:sparse_sink_rope",
     f"{_K}.triton_attention:supports_rope"),
    ("index.scores", "triton", f"{_K}.triton_indexer:scores", f"{_K}.triton_indexer:supports"),
    ("mhc.mix", "triton", f"{_K}.triton_mhc:mix", f"{_K}.triton_mhc:supports"),
    # mhc.pre_norm and mhc.expand_pre_norm: composed from the parts above (a fused two-launch kernel was 3x slower
    # than its five part launches, docs/performance.md thirty-first pass, and was removed)
    ("gemm.fp8_block", "triton", f"{_K}.triton_gemm:gemm_fp8_block", f"{_K}.triton_gemm:supports_fp8"),
    ("gemm.fp8_block_grouped", "triton", f"{_K}.triton_gemm:gemm_fp8_block_grouped",
     f"{_K}.triton_gemm:supports_fp8_grouped"),
    ("gemm.mxfp4", "triton", f"{_K}.triton_gemm:gemm_mxfp4", f"{_K}.triton_gemm:supports_mxfp4"),
    # gemm.dense: the split-K GEMV at 1-4 rows and small weights (fp32 sums in a per-split order), cuBLAS otherwise
    ("gemm.dense", "triton", f"{_K}.triton_dense_gemv:gemm_dense", f"{_K}.triton_dense_gemv:supports_dense"),
    ("gemm.dense", "aten", f"{_K}.aten_ops:gemm_dense", f"{_K}.aten_ops:supports_dense"),
    # gemm.dense_wide: the same GEMV widening x as it loads it (the fp32 router and compressor projections)
    ("gemm.dense_wide", "triton", f"{_K}.triton_dense_gemv:gemm_dense_wide",
     f"{_K}.triton_dense_gemv:supports_dense_wide"),
    ("moe.experts", "aten", f"{_K}.aten_ops:moe_experts", f"{_K}.aten_ops:supports_experts"),
    ("moe.experts_fp8", "triton", f"{_K}.triton_moe:moe_experts_fp8", f"{_K}.triton_moe:supports"),
    ("moe.experts_mxfp4", "triton", f"{_K}.triton_moe:moe_experts_mxfp4", f"{_K}.triton_moe:supports"),
    ("moe.experts_fp8", "aten", f"{_K}.aten_ops:moe_experts_fp8", f"{_K}.aten_ops:supports_experts_quant"),
    ("moe.experts_mxfp4", "aten", f"{_K}.aten_ops:moe_experts_mxfp4", f"{_K}.aten_ops:supports_experts_quant"),
    # the router's top-k and the swap kernels' layout in one launch at one token (DEEPINFER_NV_ROUTE_ALIGN=0: off);
    # not flagged, so batch-invariant mode composes it from the flagged parts
    ("moe.topk_experts_mxfp4", "triton", f"{_K}.triton_route_align:topk_experts_mxfp4",
     f"{_K}.triton_route_align:supports"),
    # the expert stacks in core's word layout where the Gluon swap kernels read them (mxfp4_layout)
    ("moe.experts_mxfp4_layout", "triton", f"{_K}.mxfp4_layout:experts_mxfp4_layout", f"{_K}.mxfp4_layout:supports"),
    # their batch-invariant launches: fixed tiles, splits from the weight shape (docstrings of each module)
    ("attention.sparse_sink", "triton_bi", f"{_K}.triton_attention:sparse_sink_bi", f"{_K}.triton_attention:supports",
     True),
    # index.scores: one program per token and a fixed candidate lane (BLOCK_N from (Hi, Di))
    ("index.scores", "triton_bi", f"{_K}.triton_indexer:scores_per_token", f"{_K}.triton_indexer:supports", True),
    ("mhc.mix", "triton_bi", f"{_K}.triton_mhc:mix_bi", f"{_K}.triton_mhc:supports", True),
    ("gemm.fp8_block", "triton_bi", f"{_K}.triton_gemm:gemm_fp8_block_bi", f"{_K}.triton_gemm:supports_fp8", True),
    ("gemm.fp8_block_grouped", "triton_bi", f"{_K}.triton_gemm:gemm_fp8_block_grouped_bi",
     f"{_K}.triton_gemm:supports_fp8_grouped", True),
    ("gemm.mxfp4", "triton_bi", f"{_K}.triton_gemm:gemm_mxfp4_bi", f"{_K}.triton_gemm:supports_mxfp4", True),
    ("gemm.dense", "triton_bi", f"{_K}.triton_gemm:gemm_dense_bi", f"{_K}.triton_gemm:supports_dense_bi", True),
    ("gemm.dense_wide", "triton_bi", f"{_K}.triton_gemm:gemm_dense_wide_bi", f"{_K}.triton_gemm:supports_dense_bi",
     True),
    ("moe.experts", "triton_bi", f"{_K}.triton_moe:moe_experts_dense_bi", f"{_K}.triton_moe:supports", True),
    ("moe.experts_fp8", "triton_bi", f"{_K}.triton_moe:moe_experts_fp8_bi", f"{_K}.triton_moe:supports", True),
    ("moe.experts_mxfp4", "triton_bi", f"{_K}.triton_moe:moe_experts_mxfp4_bi", f"{_K}.triton_moe:supports", True),
    # a second CUDA stream for a branch that reads only its arguments (the shared expert beside the routed ones):
    # the same kernels on the same operands, so invariant wherever they are (on; DEEPINFER_NV_SIDE_STREAM=0: in order)
    ("stream.side", "aten", f"{_K}.cuda_side_stream:side", f"{_K}.cuda_side_stream:supports", True),
    # vendor libraries (kernels/vendors.py: tried before triton only where they import, on SM100; never run on
    # any machine of this project): FlashMLA's sparse attention, DeepGEMM's FP8 GEMM and FP8 x FP4 grouped GEMM
    ("attention.sparse_sink", "flashmla", f"{_K}.flashmla:sparse_sink", f"{_K}.flashmla:supports"),
    ("gemm.fp8_block", "deepgemm", f"{_K}.deepgemm:gemm_fp8_block", f"{_K}.deepgemm:supports_fp8"),
    ("gemm.fp8_block_grouped", "deepgemm", f"{_K}.deepgemm:gemm_fp8_block_grouped",
     f"{_K}.deepgemm:supports_fp8_grouped"),
    ("moe.experts_mxfp4", "deepgemm", f"{_K}.deepgemm:moe_experts_mxfp4", f"{_K}.deepgemm:supports_experts"),
)


def register(registry: Any) -> list[tuple[str, str]]:
    """Register every NVIDIA implementation in ``registry`` (a KernelRegistry).

    Returns the ``(op, provider)`` pairs registered, for the platform's log line.
    Raises whatever the registry raises for an unknown op or a duplicate
    (op, provider): both are packaging bugs that must not pass silently.
    """
    done = []
    for op, provider, target, supports, *flags in IMPLS:
        registry.register_impl(op, provider, target, supports, batch_invariant=bool(flags and flags[0]))
        done.append((op, provider))
    return done
