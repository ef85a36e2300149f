"""``deepinfer_nvidia/kernels/branch_gemv.py``: a large FP8 GEMV inside a side branch as a chain of capped launches.
On the CPU with a stand-in GEMV (dequantise, then a float product): the row chunks start on 64-row tiles and scale
rows, each takes its own slice of the UE8M0 scales and asks for one program an SM, and the concatenation equals
the whole product; the cap applies only inside a branch, with the knob on, to weights of at least ``MIN_BYTES``."""
from __future__ import annotations

import pytest
import torch


def _dequant(q: torch.Tensor, s: torch.Tensor, bn_blk: int, bk_blk: int) -> torch.Tensor:
    scale = torch.exp2(s.float() - 127.0)  # UE8M0 bytes [ceil(N / bn), K / bk]
    return q.float() * scale.repeat_interleave(bn_blk, 0)[: q.shape[0]].repeat_interleave(bk_blk, 1)[:, : q.shape[1]]


@pytest.mark.parametrize("n,bn_blk,tiles", [(1000, 32, 3), (640, 128, 1), (256, 32, 8), (4096, 128, 5)])
def test_chunks_cover_the_rows_with_their_scales(n, bn_blk, tiles):
    pytest.importorskip("triton")
    from deepinfer_nvidia.kernels.branch_gemv import gemv_in_chunks

    g = torch.Generator().manual_seed(n + tiles)
    k, bk_blk = 256, 32
    x = torch.randn(2, k, generator=g)
    q = torch.randn(n, k, generator=g).clamp(-4, 4).to(torch.float8_e4m3fn)
    s = torch.randint(120, 134, (-(-n // bn_blk), k // bk_blk), generator=g).to(torch.uint8)
    calls = []

    def gemv(xx, qq, ss, s_cols, bn, bk, sms, programs=None):
        calls.append((qq.shape[0], ss.shape[0], programs))
        assert ss.shape[0] == -(-qq.shape[0] // bn) and s_cols == k // bk
        return xx @ _dequant(qq, ss, bn, bk).t()

    y = gemv_in_chunks(x, q, s, k // bk_blk, bn_blk, bk_blk, 132, gemv, tiles=tiles)
    torch.testing.assert_close(y, x @ _dequant(q, s, bn_blk, bk_blk).t(), rtol=1e-5, atol=1e-4)
    rows = max(64, bn_blk) * -(-tiles * 64 // max(64, bn_blk))
    assert [c[0] for c in calls] == [min(rows, n - r0) for r0 in range(0, n, rows)]
    assert all(c[2] == 1 for c in calls)


def test_takes_only_large_weights_inside_a_branch(monkeypatch):
    pytest.importorskip("triton")
    from deepinfer_nvidia.kernels import branch_gemv, cuda_side_stream as css

    big = torch.empty(0, dtype=torch.float8_e4m3fn).new_empty((branch_gemv.MIN_BYTES // 4096, 4096))
    small = big[:16]
    assert not branch_gemv.takes(big, tiles=32)  # lane 0: the current stream
    with css._in_branch(1):
        assert branch_gemv.takes(big, tiles=32) and not branch_gemv.takes(small, tiles=32)
        assert not branch_gemv.takes(big, tiles=0)  # the knob off
