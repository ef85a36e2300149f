"""``benchmarks/step_glue_ops.py`` on the CPU: it counts the torch ops of one graphed decode step that run
outside registered kernels. A core helper that the model calls directly, not through the registry (the shared
expert's ``clamped_swiglu``), launches its own torch kernels on a GPU and must be counted; a registered kernel's
reference body must not be."""
from __future__ import annotations

import re
import sys

from benchmarks import step_glue_ops


def test_counts_direct_helpers_but_not_registered_kernels(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["step_glue_ops.py", "--topology", "mixed", "--batch", "1", "--top", "200"])
    step_glue_ops.main()
    out = capsys.readouterr().out
    total, layers = (int(v) for v in re.search(r"(\d+) layers, batch 1: (\d+) glue ops", out).group(2, 1))
    lines = dict((where, int(n)) for n, where in re.findall(r"^\s+(\d+)\s+(\S+:\d+:\S+)$", out, re.M))
    assert total == sum(lines.values()) and total > 0
    # the shared expert's SwiGLU: called directly by the MoE wrapper, so its ops are glue (several a layer)
    swiglu = sum(n for where, n in lines.items() if where.endswith(":clamped_swiglu"))
    assert swiglu >= 2 * layers, lines
    # registered kernels' CPU references (norms, RoPE, attention, the experts) are kernel work, never glue
    refs = ("deepinfer_core/kernels/ops/norm.py", "deepinfer_core/kernels/ops/rope.py",
            "deepinfer_core/kernels/ops/attention.py")
    assert not [w for w in lines if w.startswith(refs)], lines
