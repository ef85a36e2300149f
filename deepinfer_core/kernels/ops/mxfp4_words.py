"""The word layout of MXFP4 expert stacks: a bit permutation inside every 4-byte word, chosen once at load time.

The checkpoint packs two e2m1 codes a byte (element 2i in the low nibble, sign on top), so one little-endian
4-byte word holds 8 consecutive K elements at bits 4j..4j+3. A kernel that turns a word into 4 bf16x2 registers
(elements (j, j+4) per register, magnitude bits on bf16 bits 6-8 / 22-24, sign on 15 / 31) needs two shifts,
a mask and a merge per register from that order: 19 instructions a word with the multiplies. The word layout
moves each element's 4 bits so that two registers need one shift (or none) and no merge: 15 instructions a word,
the cheapest layout of an exhaustive search over rotations (docs/performance_pass_27.md; 40th pass measures it).

Core defines the format so that every provider can read it: a platform's ``moe.experts_mxfp4_layout`` may return
the stacks as ``int32 [E, N, K/8]`` words in this layout (the dtype is the tag), and any ``moe.experts_mxfp4``
implementation that does not decode it natively calls ``expert_bytes`` first. The reference layout op keeps the
checkpoint bytes.
"""
from __future__ import annotations

import torch

# Per output register r (elements r and r+4 of the word): (magnitude shift, sign shift) of the decode, a left shift
# when >= 0, else a right shift. Registers 0 and 2 take one shift (or none) and a mask; 1 and 3 two shifts.
WORD_PLAN = ((0, 0), (3, 1), (6, 6), (-5, 5))
# bytes of a stack repacked at a time: bounds the int64 transients (~10x a chunk) of the repacks; a V4.1 stack is
# 2.3 GB, one expert of it 5.9 MB
_CHUNK_BYTES = 32 << 20


def word_positions() -> list[tuple[int, int]]:
    """Element j (0..7) of a word -> (bit of its lowest magnitude bit, bit of its sign) in the word layout."""
    out = []
    for j in range(8):
        m, s = WORD_PLAN[j % 4]
        half = 16 * (j // 4)
        out.append((6 + half - m, 15 + half - s))
    return out


def _check_rows(w: torch.Tensor) -> None:
    if w.dtype != torch.uint8 or w.dim() == 0 or w.shape[-1] % 4:
        raise ValueError(f"MXFP4 stacks repack as uint8 rows of whole 4-byte words, got {w.dtype} {tuple(w.shape)}")


def _words(w: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., B]`` (B % 4 == 0) -> its little-endian 4-byte words as non-negative int64 ``[..., B/4]``."""
    _check_rows(w)
    return w.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _bytes(words: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    signed = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return signed.view(torch.uint8).reshape(shape)


def pack_words(w: torch.Tensor) -> torch.Tensor:
    """Checkpoint MXFP4 bytes ``[..., K/2]`` uint8 -> the same shape and dtype in the word layout."""
    words, out = _words(w), None
    for j, (mag, sign) in enumerate(word_positions()):
        nib = (words >> (4 * j)) & 0xF
        part = ((nib & 7) << mag) | ((nib >> 3) << sign)
        out = part if out is None else out | part
    return _bytes(out, w.shape)


def unpack_words(w: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_words``: word-layout bytes ``[..., K/2]`` uint8 back to the checkpoint's order."""
    words, out = _words(w), None
    for j, (mag, sign) in enumerate(word_positions()):
        part = (((words >> mag) & 7) | (((words >> sign) & 1) << 3)) << (4 * j)
        out = part if out is None else out | part
    return _bytes(out, w.shape)


def _repack_into(out: torch.Tensor, stack: torch.Tensor) -> torch.Tensor:
    if stack.dim() != 3:
        raise ValueError(f"an MXFP4 expert stack is [E, N, K/2] uint8, got {stack.dtype} {tuple(stack.shape)}")
    _check_rows(stack)  # dtype and width before any work
    step = max(1, _CHUNK_BYTES // max(1, stack[0].numel()))
    for e0 in range(0, stack.shape[0], step):
        out[e0:e0 + step] = pack_words(stack[e0:e0 + step])
    return out.view(torch.int32)


def to_word_layout(stack: torch.Tensor) -> torch.Tensor:
    """A checkpoint stack ``[E, N, K/2]`` uint8 -> a new ``int32 [E, N, K/8]`` in the word layout (the input is
    left as it is)."""
    return _repack_into(torch.empty(stack.shape, dtype=torch.uint8, device=stack.device), stack)


def to_word_layout_(stack: torch.Tensor) -> torch.Tensor:
    """``to_word_layout`` in place: the stack's own storage is repacked a chunk at a time (no second copy of the
    stack, which a model loaded near its memory would not have room for) and returned as an ``int32`` view. A
    non-contiguous stack is copied instead."""
    if not stack.is_contiguous():
        return to_word_layout(stack)
    return _repack_into(stack, stack)


def is_word_layout(stack: torch.Tensor) -> bool:
    """Whether an MXFP4 weight stack (or one expert of it) is in the word layout: ``int32`` words."""
    return stack.dtype == torch.int32


def expert_bytes(stack: torch.Tensor) -> torch.Tensor:
    """An MXFP4 weight stack (or one expert's matrix) as checkpoint bytes ``[..., K/2]`` uint8, whichever layout
    it is in (a word-layout stack is unpacked into a new tensor)."""
    return unpack_words(stack.view(torch.uint8)) if is_word_layout(stack) else stack


def experts_mxfp4_layout(w1: torch.Tensor, s1: torch.Tensor, w3: torch.Tensor, s3: torch.Tensor, w2: torch.Tensor,
                         s2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``moe.experts_mxfp4_layout``'s reference: the stacks as the platform's ``moe.experts_mxfp4`` reads them
    best. Here: as loaded (checkpoint bytes ``[E, N, K/2]`` uint8 with UE8M0 scales ``[E, N, K/32]``). A provider
    may return the weight stacks in the word layout, repacked in place (``to_word_layout_``): callers hand over
    stacks they own and keep only what it returns. The scales never change."""
    return w1, s1, w3, s3, w2, s2
