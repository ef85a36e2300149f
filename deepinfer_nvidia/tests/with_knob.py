"""Run a script with module-level kernel knobs set first (for device passes comparing a knob on and off).

    python3 -m deepinfer_nvidia.tests.with_knob triton_moe.FP8_GROUPED=True [MORE=...] -- benchmarks/sweep.py ARGS

Each ``MODULE.NAME=VALUE`` sets ``deepinfer_nvidia.kernels.MODULE.NAME`` to the Python literal VALUE; the module
must already have NAME (a typo fails instead of setting a knob nobody reads). Then the script runs as __main__
with ARGS as its argv, in this process, so the kernels it imports see the knobs."""
from __future__ import annotations

import ast
import importlib
import runpy
import sys


def set_knob(spec: str) -> None:
    """``"triton_mhc.DECODE_SPLIT_FN=True"`` -> deepinfer_nvidia.kernels.triton_mhc.DECODE_SPLIT_FN = True."""
    target, sep, value = spec.partition("=")
    mod_name, dot, attr = target.rpartition(".")
    if not sep or not dot:
        raise SystemExit(f"with_knob: expected MODULE.NAME=VALUE, got {spec!r}")
    mod = importlib.import_module(f"deepinfer_nvidia.kernels.{mod_name}")
    if not hasattr(mod, attr):
        raise SystemExit(f"with_knob: deepinfer_nvidia.kernels.{mod_name} has no knob {attr!r}")
    setattr(mod, attr, ast.literal_eval(value))


def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        raise SystemExit("usage: with_knob MODULE.NAME=VALUE [...] -- SCRIPT [ARGS]")
    cut = argv.index("--")
    for spec in argv[:cut]:
        set_knob(spec)
    script, *args = argv[cut + 1:]
    sys.argv = [script] + args
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
