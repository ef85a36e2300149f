"""``benchmarks/step_glue_ops.py`` on the CPU: it counts the torch ops of one graphed decode step that run
outside registered kernels. A core helper that the model calls directly, not through the registry (the runner's
``context_from_packed``), launches its own torch kernels on a GPU and must be counted; a registered kernel's
reference body must not be (since the thirty-second pass that includes the shared expert's activation,
``moe.clamped_swiglu``, and the top-k slot map, ``index.entry_slots``: five torch kernels a layer each before)."""
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
    # the runner's step unpacking: a core helper called directly, so its ops are glue
    assert sum(n for where, n in lines.items() if where.endswith(":context_from_packed")) >= 2, lines
    # registered kernels' CPU references (norms, RoPE, attention, the experts, the shared expert's activation,
    # the top-k slot map) are kernel work, never glue
    refs = ("deepinfer_core/kernels/ops/norm.py", "deepinfer_core/kernels/ops/rope.py",
            "deepinfer_core/kernels/ops/attention.py", "deepinfer_core/kernels/ops/moe.py",
            "deepinfer_core/kernels/ops/indexer.py")
    assert not [w for w in lines if w.startswith(refs)], lines
    assert not [w for w in lines if w.endswith((":clamped_swiglu", ":entry_slots"))], lines
    # what those two ops replaced: no where/gather map of the top-k positions left in the attention
    assert total <= 30 * layers, (total, layers)  # 196 on 7 layers here; 268 before the two ops
