"""Core's word layout of MXFP4 expert stacks (``deepinfer_core.kernels.ops.mxfp4_words``) on the CPU: a bit
permutation with an exact inverse, the reference experts reading either layout, the layout op's contract through
the conformance harness, bad stacks named, and a tiny V4.1 whose stacks a provider repacks at load giving the same
logits bit for bit."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from deepinfer_core.kernels.ops import mxfp4_words as mw
from deepinfer_core.kernels.ops.moe import _gen_experts_mxfp4, experts_mxfp4
from deepinfer_core.kernels.ops.quant import dequant_mxfp4
from deepinfer_core.kernels.registry import get_registry
from deepinfer_core.testing.conformance import check_impl


def _words_layout(w1, s1, w3, s3, w2, s2):
    """A provider that always repacks (what the nvidia one does on SM90)."""
    return mw.to_word_layout(w1), s1, mw.to_word_layout(w3), s3, mw.to_word_layout(w2), s2


def _scales_changed(w1, s1, w3, s3, w2, s2):
    return w1, s1, w3, s3, w2, s2.view(torch.uint8).add(1).view(s2.dtype)


@pytest.fixture(scope="module")
def registry():
    reg = get_registry()
    for name, target in (("test_words", "tests.core.test_mxfp4_words:_words_layout"),
                         ("test_bad_scales", "tests.core.test_mxfp4_words:_scales_changed")):
        if name not in reg.providers("moe.experts_mxfp4_layout"):
            reg.register_impl("moe.experts_mxfp4_layout", name, target)
    return reg


def test_pack_is_a_bit_permutation_with_an_inverse():
    cells = sorted(b for mag, sign in mw.word_positions() for b in (mag, mag + 1, mag + 2, sign))
    assert cells == list(range(32))
    g = torch.Generator().manual_seed(0)
    w = torch.randint(0, 256, (5, 7, 24), generator=g, dtype=torch.uint8)
    p = mw.pack_words(w)
    assert p.dtype == torch.uint8 and p.shape == w.shape and not torch.equal(p, w)
    assert torch.equal(mw.unpack_words(p), w)
    # nibble j of a word keeps its code: element 0 (low nibble of byte 0) of a word 0x0000000F is code 15 (-6)
    one = mw.pack_words(torch.tensor([[0x0F, 0, 0, 0]], dtype=torch.uint8)).view(torch.int32).item() & 0xFFFFFFFF
    mag, sign = mw.word_positions()[0]
    assert one == (7 << mag) | (1 << sign)


def test_to_word_layout_chunks_and_tags_with_int32(monkeypatch):
    monkeypatch.setattr(mw, "_CHUNK_BYTES", 3 * 4 * 16)  # three experts a chunk: several chunks, the last one short
    g = torch.Generator().manual_seed(1)
    w = torch.randint(0, 256, (7, 4, 16), generator=g, dtype=torch.uint8)
    keep = w.clone()
    out = mw.to_word_layout(w)
    assert out.dtype == torch.int32 and out.shape == (7, 4, 4) and mw.is_word_layout(out)
    assert torch.equal(w, keep)  # the input is left as it is
    assert torch.equal(mw.expert_bytes(out), w) and mw.expert_bytes(w) is w
    assert torch.equal(mw.expert_bytes(out[2]), w[2])  # one expert of a stack
    inplace = mw.to_word_layout_(w)  # the same words in the stack's own storage
    assert inplace.data_ptr() == w.data_ptr() and torch.equal(inplace, out)
    strided = keep.transpose(1, 2).contiguous().transpose(1, 2)  # not contiguous: copied, the input kept
    assert torch.equal(mw.to_word_layout_(strided), out) and torch.equal(strided, keep)


@pytest.mark.parametrize("bad,match", [(torch.zeros(2, 3, 6, dtype=torch.uint8), "whole 4-byte words"),
                                       (torch.zeros(2, 3, 8, dtype=torch.int8), "uint8"),
                                       (torch.zeros(3, 8, dtype=torch.uint8), r"\[E, N, K/2\]")])
def test_bad_stacks_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        mw.to_word_layout(bad)


def test_reference_experts_read_either_layout():
    cases = list(_gen_experts_mxfp4(torch.float32, "cpu", 0))
    plain = [a for a, _ in cases if a[3].dtype == torch.uint8]
    packed = [a for a, _ in cases if a[3].dtype == torch.int32]
    assert plain and len(packed) == len([a for a in plain if a[3].shape[2] % 4 == 0 and a[7].shape[2] % 4 == 0])
    for a in plain:
        words = tuple(mw.to_word_layout(t) if i in (3, 5, 7) else t for i, t in enumerate(a))
        assert torch.equal(experts_mxfp4(*words), experts_mxfp4(*a))


def test_layout_op_contract_in_the_conformance_harness(registry):
    assert registry.resolve("moe.experts_mxfp4_layout")[0] == "reference"  # the reference keeps the checkpoint's
    assert check_impl("moe.experts_mxfp4_layout", "test_words", registry=registry) > 0
    with pytest.raises(AssertionError, match="scale stack 2 changed"):
        check_impl("moe.experts_mxfp4_layout", "test_bad_scales", registry=registry)


def test_tiny_v41_with_repacked_experts_gives_the_same_logits(registry, monkeypatch):
    monkeypatch.delenv("DEEPINFER_KERNELS", raising=False)  # tests/conftest.py pins every op to its reference
    from deepinfer_models.deepseek_v41.checkpoint_writer import write_tiny_v41_checkpoint
    from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
    from tests.models.paged_checks import full_logits, prompt

    ids = prompt(9, seed=3)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_v41_checkpoint(Path(tmp) / "tiny", quant="fp4")
        plain = load_deepseek_v41(path, dtype=torch.float32)
        words = load_deepseek_v41(path, dtype=torch.float32,
                                  kernel_overrides={"moe.experts_mxfp4_layout": "test_words"})
    moe = [layer["ffn"] for layer in words.layers if "ffn" in layer][0]
    assert [t.dtype for t in moe.experts[::2]] == [torch.int32] * 3
    with torch.inference_mode():
        assert torch.equal(full_logits(words, ids), full_logits(plain, ids))


def test_nvidia_dequant_once_unpacks_a_chunk_at_a_time(monkeypatch):
    """``triton_moe.dequant_once_mxfp4`` (the long-prefill path) on word-layout stacks: each chunk of experts is
    unpacked as it is dequantised, and the result equals the checkpoint stacks'. Its CUDA-only parts (the dequant
    and slot-sum launches, the CUTLASS grouped GEMM) are stood in for by torch, so the chunk logic runs here."""
    tm = pytest.importorskip("deepinfer_nvidia.kernels.triton_moe")
    from tests.kernels.moe_cases import mxfp4_experts, routing

    def grouped_mm(a, b, offs):  # rows [offs[i-1], offs[i]) of a times b[i]
        out, start = [], 0
        for i, end in enumerate(offs.tolist()):
            out.append(a[start:end].float() @ b[i].float())
            start = end
        return torch.cat(out).to(a.dtype)

    def sum_slices(src, m, n, s, stride_s, stride_m, dtype):  # y [m * s, n] in token-major slot order
        return src.view(m, s, n).sum(1).to(dtype)

    def dequant_stack(w, s, dtype):  # core's dequant refuses int32: a chunk handed over packed would fail here
        return torch.stack([dequant_mxfp4(w[i], s[i]) for i in range(w.shape[0])]).to(dtype)

    monkeypatch.setattr(torch, "_grouped_mm", grouped_mm, raising=False)
    monkeypatch.setattr(tm, "sum_slices", sum_slices)
    monkeypatch.setattr(tm, "dequant_mxfp4_stack", dequant_stack)
    g = torch.Generator().manual_seed(0)
    ws = mxfp4_experts(g, 8, 64, 32)
    x = torch.randn(5, 64, generator=g).bfloat16()
    ids, w = routing(g, 5, 3, 8, "rand"), torch.rand(5, 3, generator=g)
    words = [mw.to_word_layout(t) if i % 2 == 0 else t for i, t in enumerate(ws)]
    plain = tm.dequant_once_mxfp4(x, w, ids, *ws, 10.0, chunk=3)
    assert torch.equal(tm.dequant_once_mxfp4(x, w, ids, *words, 10.0, chunk=3), plain)
    assert (plain.float() - experts_mxfp4(x, w, ids, *ws, 10.0).float()).abs().max() < 5e-2
