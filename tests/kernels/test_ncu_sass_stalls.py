"""``deepinfer_nvidia/tests/ncu_sass_stalls.py`` on a made-up Nsight Compute source-page CSV: the reasons' totals,
the busiest instruction first, and the samples split at the longest backward branch."""
from __future__ import annotations

from deepinfer_nvidia.tests.ncu_sass_stalls import kernels, main_loop, summary

HEAD = ['"Address"', '"Source"', '"Warp Stall Sampling (All Samples)"', '"stall_barrier"', '"stall_long_sb"',
        '"stall_barrier (Not Issued)"']


def _row(addr: int, src: str, barrier: int, long_sb: int) -> str:
    return ",".join(f'"{v}"' for v in (hex(addr), src, barrier + long_sb, barrier, long_sb, 0))


def test_summary_splits_prologue_loop_epilogue(tmp_path):
    rows = [_row(0x100, "LDG.E R2, [R4]", 0, 5), _row(0x110, "BAR.SYNC 0x0", 7, 0),
            _row(0x120, "LOP3.LUT R1, R2, 0x1, RZ", 1, 0), _row(0x130, "@P0 BRA 0x110", 0, 0),
            _row(0x140, "EXIT", 0, 2)]
    path = tmp_path / "s.csv"
    path.write_text('"Kernel Name","k",\n' + ",".join(HEAD) + "\n" + "\n".join(rows) + "\n")
    (head, sass), = kernels(str(path))
    assert main_loop(sass) == (1, 3)
    text = summary(str(path), top=2)
    assert "15 samples" in text and "long_sb 7 (47%)" in text and "barrier 8 (53%)" in text
    lines = text.splitlines()
    assert "BAR.SYNC" in lines[2] and "barrier=7" in lines[2]  # the busiest instruction first
    assert "prologue     1 lines     5 samples (33%)" in text
    assert "loop         3 lines     8 samples (53%)" in text
    assert "epilogue     1 lines     2 samples (13%)" in text
