"""Shared fixture of the kernel tests: run a script under Triton's CPU interpreter in its own process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_interpreted():
    """``run(code, expect)``: runs ``code`` with ``TRITON_INTERPRET=1`` (own process: the flag is read when the
    kernels are decorated) from the repository root, asserts it exits 0 and prints ``expect``; returns the
    finished process. Skips when triton is not installed."""
    pytest.importorskip("triton")

    def run(code: str, expect: str, timeout: int = 300) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(TRITON_INTERPRET="1", PYTHONPATH=str(REPO_ROOT))
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert expect in proc.stdout, proc.stdout[-2000:]
        return proc

    return run
