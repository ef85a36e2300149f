"""Count the SASS of a Triton or Gluon kernel's main loop for sm_90a, on any machine (no GPU needed).

    python -m deepinfer_nvidia.tests.sass_count MODULE:KERNEL 'name=type,...' 'CONST=value,...' \\
        [--warps 4] [--stages 3] [--elems N] [--div16 name,name]

The Triton wheel ships ``ptxas`` and ``nvdisasm``, so ``triton.compile`` can target ``GPUTarget("cuda", 90, 32)``
on a CPU machine. This compiles the kernel (a ``@gluon.jit`` one through ``GluonASTSource``), disassembles the
cubin, finds the longest backward branch (the main loop) and prints the loop's instruction count, the count
per thread-element when ``--elems`` (weight elements per thread per iteration) is given, and the opcode
histogram. Pointer arguments and the ``--div16`` integers are marked divisible by 16, as the launcher
specialises them at run time. Use the Triton version the GPU runs (3.6 on the H200: ``pip install
triton==3.6.0`` into a side environment) so the counts are the device's. docs/performance.md (eleventh pass)
lists what these counts showed.

Example (the swap-AB up kernel with the fragment decode; torch is not needed)::

    python -m deepinfer_nvidia.tests.sass_count deepinfer_nvidia.kernels.gluon_moe_swap:_swap_kernel \\
      'x_ptr=*bf16,pair_ptr=*i32,bexp_ptr=*i32,wa_ptr=*u8,sa_ptr=*u8,wb_ptr=*u8,sb_ptr=*u8,wt_ptr=*fp32,'\\
'out_ptr=*bf16,P=i32,E=i32,N=i32,K=i32,row_bytes=i32,stride_x=i32,limit=fp32,NT=i32' \\
      'TOPK=6,UP=1,BLOCK_M=16,BLOCK_N=64,BLOCK_K=128,STAGES=3,SAFE=0,AREG=2,PROBE=0,num_warps=4' \\
      --elems 128 --div16 N,K,row_bytes,stride_x
"""
from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import os
import re
import subprocess
import sys
import tempfile


_INSTRUCTION = re.compile(r"\s+/\*[0-9a-f]{4,}\*/")
_PREFIX = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?")  # address, then an optional predicate


def opcodes(sass: str | list[str]) -> list[str]:
    """The opcodes (``LDG.E.128``, ``BAR.SYNC.DEFER_BLOCKING`` ...) of a disassembly, or of its instruction
    lines (``count``'s ``loop``), in order, without addresses and predicates."""
    lines = sass.splitlines() if isinstance(sass, str) else sass
    return [_PREFIX.sub("", line).split()[0] for line in lines if _INSTRUCTION.match(line)]


def _loop_body(sass: str) -> list[str]:
    """Instructions between the target of the longest backward branch and the branch."""
    lines = sass.splitlines()
    is_ins = re.compile(r"\s+/\*([0-9a-f]{4,})\*/")
    labels = {}
    for j, line in enumerate(lines):
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            nxt = [x for x in lines[j + 1:j + 5] if is_ins.match(x)]
            if nxt:
                labels[m.group(1)] = int(is_ins.match(nxt[0]).group(1), 16)
    ins = [x for x in lines if is_ins.match(x)]
    best = None
    for line in ins:
        m = re.search(r"BRA.*(\.L_x_\d+)", line)
        addr = int(is_ins.match(line).group(1), 16)
        if m and m.group(1) in labels and labels[m.group(1)] < addr:
            if best is None or addr - labels[m.group(1)] > best[1] - best[0]:
                best = (labels[m.group(1)], addr)
    if best is None:
        return []
    return [x for x in ins if best[0] <= int(is_ins.match(x).group(1), 16) <= best[1]]


def missing_tools(kernel_module) -> str | None:
    """Why this machine cannot count ``kernel_module``'s kernels (None when it can): Gluon absent from the
    installed Triton (modules with an ``available()``: the Gluon ones), or a Triton wheel without ``nvdisasm``.
    The SASS tests skip on it."""
    import triton

    if hasattr(kernel_module, "available") and not kernel_module.available():
        return "triton.experimental.gluon missing"
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")):
        return "this triton wheel has no nvdisasm"
    return None


def count(fn, signature: dict[str, str], constexprs: dict[str, int], warps: int = 4, stages: int = 3,
          div16: frozenset[str] = frozenset(), maxnreg: int | None = None) -> dict:
    """Compile ``fn`` (``@triton.jit`` or ``@gluon.jit``) for sm_90a and count its main loop: returns
    ``{"loop": [instruction lines], "ops": Counter of opcodes, "registers": int | None, "shared": bytes,
    "sass": the whole disassembly}`` (``opcodes(r["sass"])``: every opcode in order)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # the kernel's parameter order (``attrs`` index parameters by position), with the constexpr parameters not
    # given taking their defaults (a kernel may grow a defaulted knob without every caller naming it)
    params = inspect.signature(getattr(fn, "fn", fn)).parameters
    constexprs = dict(constexprs)
    for name, p in params.items():
        if name not in signature and name not in constexprs and p.default is not inspect.Parameter.empty:
            constexprs[name] = p.default
    order = [n for n in params if n in signature or n in constexprs]
    order += [n for n in (*signature, *constexprs) if n not in order]
    sig = {n: signature.get(n, "constexpr") if n not in constexprs else "constexpr" for n in order}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig) if sig[n].startswith("*") or n in div16}
    source = ASTSource
    if type(fn).__module__.startswith("triton.experimental.gluon"):
        from triton.experimental.gluon._runtime import GluonASTSource as source
    compiled = triton.compile(source(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages,
                                                                          **({"maxnreg": maxnreg} if maxnreg else {})})
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(compiled.asm["cubin"])
        fh.flush()
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", fh.name], capture_output=True, text=True,
                              check=True).stdout
        res = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", fh.name], capture_output=True,
                             text=True).stdout
    body = _loop_body(sass)
    ops = collections.Counter(opcodes(body))
    regs = re.search(r"REG:(\d+)", res)
    return {"loop": body, "ops": ops, "registers": int(regs.group(1)) if regs else None,
            "shared": compiled.metadata.shared, "sass": sass}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", help="module:attribute of the @triton.jit / @gluon.jit function")
    ap.add_argument("signature", help="name=type,... for the runtime arguments (triton type strings)")
    ap.add_argument("constexprs", help="NAME=int,... (num_warps included for Gluon kernels that declare it)")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--elems", type=float, default=0.0, help="weight elements per thread per loop iteration")
    ap.add_argument("--div16", default="", help="integer arguments to mark divisible by 16")
    ap.add_argument("--maxnreg", type=int, default=0, help="register cap per thread (0: the compiler's choice)")
    args = ap.parse_args(argv)
    if "torch" not in sys.modules:  # the kernel modules import torch at the top; compiling needs none of it
        try:
            importlib.import_module("torch")
        except ImportError:
            import types
            sys.modules["torch"] = types.ModuleType("torch")
    import triton

    mod, attr = args.kernel.split(":")
    fn = getattr(importlib.import_module(mod), attr)
    sig = dict(kv.split("=") for kv in args.signature.split(",") if kv)
    consts = {k: int(v) for k, v in (kv.split("=") for kv in args.constexprs.split(",") if kv)}
    r = count(fn, sig, consts, args.warps, args.stages, frozenset(args.div16.split(",")) if args.div16 else frozenset(),
              args.maxnreg or None)
    per = f", {len(r['loop']) / args.elems:.2f} per element" if args.elems else ""
    print(f"{attr}: triton {triton.__version__}, registers {r['registers']}, shared {r['shared']} B, main loop "
          f"{len(r['loop'])} instructions{per}")
    print(" ".join(f"{k}:{v}" for k, v in r["ops"].most_common(40)))


if __name__ == "__main__":
    main()
