"""``moe.experts_mxfp4_layout`` on NVIDIA: the expert stacks in core's word layout where the swap kernels read them.

The Gluon swap-AB kernels (``gluon_moe_swap``, ``gluon_swap_pair``) decode a word-layout word in 15 instructions
against the checkpoint order's 19 (``mxfp4_word_decode``): their K loops shrink 433 -> 369 (up) and 253 -> 221
(down) instructions (Triton 3.6 SASS), and one token's paired call 60.7 -> 56.7 us on an H100 (pass40b), bit-equal.
So where those kernels run (Gluon importable, an SM90 device, the swap path on), the stacks are repacked once at
load; ``moe.experts_mxfp4``'s other paths unpack what they read (``triton_moe``), and core's reference unpacks too.

Not in batch-invariant mode: its grouped kernels read checkpoint bytes, and a whole-stack unpack each call would
cost more than the decode saves. ``DEEPINFER_NV_MXFP4_WORD_LAYOUT=0`` keeps the checkpoint layout.
"""
from __future__ import annotations

import os

import torch

from deepinfer_core.kernels.ops.mxfp4_words import experts_mxfp4_layout as keep_layout, to_word_layout

WORD_LAYOUT = os.environ.get("DEEPINFER_NV_MXFP4_WORD_LAYOUT", "1") == "1"


def swap_reads_words(w: torch.Tensor) -> bool:
    """Whether the stacks of ``w``'s device go to the Gluon swap kernels in the word layout: the knob, Gluon, an
    SM90 device, the swap path enabled, default (not batch-invariant) kernel mode, and checkpoint bytes in whole
    4-byte words (K a multiple of 8)."""
    from deepinfer_core.kernels.mode import batch_invariant_enabled
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw

    return (WORD_LAYOUT and sw.available() and sw.SWAP_MAX_PAIRS > 0 and w.is_cuda and w.dtype == torch.uint8
            and w.dim() == 3 and w.shape[-1] % 4 == 0 and torch.cuda.get_device_capability(w.device)[0] == 9
            and not batch_invariant_enabled())


def experts_mxfp4_layout(w1, s1, w3, s3, w2, s2):
    """``moe.experts_mxfp4_layout``: w1, w3 [E, F, D/2], w2 [E, D, F/2] uint8 -> ``int32 [E, N, K/8]`` word-layout
    stacks, repacked in place (a model near its memory has no room for a second copy: the V4.1 slice on an H100,
    pass40c and pass40d), where ``swap_reads_words`` holds for all three; else the stacks as given. The scales as
    given."""
    if not all(swap_reads_words(w) for w in (w1, w3, w2)):
        return keep_layout(w1, s1, w3, s3, w2, s2)
    return _repacked(w1), s1, _repacked(w3), s3, _repacked(w2), s2


def _repacked(w: torch.Tensor) -> torch.Tensor:
    """In place by one Triton pass (no memory: the V4.1 slice on an H100 had 40 MB free, pass40d), or a repacked
    copy by core's chunked torch form for a stack that is not contiguous (no storage of its own to repack)."""
    from deepinfer_nvidia.kernels.triton_words import pack_words_inplace

    return pack_words_inplace(w) if w.is_contiguous() else to_word_layout(w)


def supports(w1, s1, w3, s3, w2, s2) -> bool:
    return all(isinstance(w, torch.Tensor) and w.is_cuda for w in (w1, w3, w2))
