"""Whether models take a decode step's shortcuts (``DEEPINFER_DECODE_SHORTCUTS``, on; read at import).

A decode step's ``StepContext`` has ``one_token_each`` set: token i is slice i's only token, and ``ctx.extras``
carries ``token_slot [B]`` (the slices' state slots) and ``seq_last_row [B]``. With the shortcuts on, models read
those as they are instead of index math over ``token_seq`` / ``seq_first_row`` (gathers whose results are the
identity or those very tensors at decode): fewer small launches on a graphed decode step's chain (forty-second and
forty-third passes). Off (``DEEPINFER_DECODE_SHORTCUTS=0``): the general formulas, the same values, for A/B runs and
the tests that compare the two.
"""
from __future__ import annotations

import os

from deepinfer_core.runner.context import StepContext

DECODE_SHORTCUTS = os.environ.get("DEEPINFER_DECODE_SHORTCUTS", "1") == "1"


def decode_shortcuts(ctx: StepContext) -> bool:
    """True when ``ctx`` is a decode layout and the shortcuts are on (read at call time, so tests can flip them)."""
    return DECODE_SHORTCUTS and ctx.one_token_each
