"""Programmatic dependent launch (PDL, SM90+) for the Triton kernels of a decode step.

A kernel launched with PDL may be scheduled while the previous kernel of the stream is still running, once
every program of that kernel has signalled ``griddepcontrol.launch_dependents``; it must then execute
``griddepcontrol.wait`` (which returns when the previous kernel has completed and its writes are visible)
before it touches memory. What this hides is the launch latency between two dependent kernels, ~1-2 us a
launch on the H200 (the wgmma GEMV in rings: 133 -> 118 us a layer for nine launches, eighteenth pass),
which at batch 1 is a large part of a ~500-launch step.

Every kernel taking part follows one rule, so the chain stays correct whatever runs next to it:
``pdl_enter(PDL)`` is its first statement (wait first, so no program reads or writes before the previous
kernel is done, and only then release the next kernel, so at most one kernel waits behind a running one).
The wait is transitive: a kernel that waited completes only after its predecessor, so a kernel further on
that waits for it also waits for every kernel before. Kernels without PDL (torch's, cuBLAS's) break the
overlap but not the correctness: a PDL launch after them is an ordinary launch, and they start after a PDL
kernel completes.

The exceptions read, before their wait, only what no kernel in the chain is still writing: the wgmma GEMVs
request their first weight tiles; the swap experts' down launch (``gluon_swap_pair`` ``EARLY_W``) its weight tiles,
scale words and the ids written by the align launch two kernels back, which was complete before the up launch's
wait returned; the dense GEMV (``triton_dense_gemv`` ``EARLY``) asks L2 for weight lines, a request that returns
nothing. ``tests/kernels/test_pdl_sass.py`` holds every other kernel to the rule.

``_common.PDL`` (on by default; ``DEEPINFER_NV_PDL=0`` turns it off) switches it for the launches that pass
``**pdl_launch()`` (the wgmma GEMV takes its default from it too); the interpreter (CPU tests) and devices before
SM90 never get the launch option.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from deepinfer_nvidia.kernels import _common


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """First statement of a kernel launched through ``pdl_launch``: wait for the previous kernel, then let the
    next one launch. A no-op when PDL is 0 (and both instructions are no-ops in a launch without PDL)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


def _interpreting() -> bool:
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    return bool(getattr(runtime, "interpret", False))


@functools.lru_cache(maxsize=1)
def _platform_ok() -> bool:
    """Triton compiles for a GPU (not the interpreter) and the process's CUDA device is SM90 or later. Asked once:
    ``pdl_launch`` runs at every launch of an eager step."""
    return (not _interpreting() and torch.cuda.is_available()
            and torch.cuda.get_device_capability(torch.cuda.current_device())[0] >= 9)


_ON = {"PDL": 1, "launch_pdl": True}


def pdl_launch() -> dict:
    """Launch keywords for a kernel that starts with ``pdl_enter(PDL)``: ``{"PDL": 1, "launch_pdl": True}``
    when ``_common.PDL`` is on, the device is SM90 or later and Triton is not interpreting, else ``{}`` (the
    kernel's PDL=0 default)."""
    return dict(_ON) if _common.PDL and _platform_ok() else {}

try:  # Gluon (experimental, absent in older Triton): the same two instructions for the Gluon kernels
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:  # pragma: no cover - depends on the installed triton
    gluon = None

if gluon is None:
    gluon_grid_dependency = None
else:
    @gluon.jit
    def gluon_grid_dependency(WAIT: gl.constexpr):
        """Programmatic dependent launch (SM90+): WAIT blocks until the previous kernel of the stream has completed
        and its writes are visible; else signal that the next kernel may launch. Both are no-ops in a launch
        without the programmatic attribute."""
        if WAIT:
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        else:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
