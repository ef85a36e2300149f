"""Session defaults for every test: CPU platform, reference kernels, seeded RNGs.

The environment defaults are set with ``os.environ.setdefault`` at import time
(before any test module imports deepinfer_core), so an explicit value in the
caller's environment still wins. Tests that need a different value use
pytest's ``monkeypatch`` locally; subprocess-based tests build their own env.
"""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("DEEPINFER_KERNELS", "reference")
os.environ.setdefault("DEEPINFER_ACCELERATOR", "cpu")

# pytest's `pythonpath = ["."]` (pyproject.toml) already does this when run from
# the repository; keep it for runs started with another rootdir or config.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

SEED = 0

# The test models are tiny: OpenMP wake-ups cost more than they save on 2 cores, and
# a fixed thread count keeps CPU kernel choices (and so the bits) stable.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_rngs():
    """Every test starts from the same RNG state, whatever ran before it."""
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    yield
