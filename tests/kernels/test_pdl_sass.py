"""Programmatic dependent launch in the step's Triton and Gluon kernels (``triton_pdl``), checked without a GPU.

The rule each PDL kernel follows (``triton_pdl`` says why it keeps the chain correct): its first statement is
``pdl_enter(PDL)`` (Gluon: ``gluon_grid_dependency(True)`` then ``(False)``), and each of its launches passes
``**pdl_launch()``. The source test holds every kernel in ``deepinfer_nvidia/kernels`` to it; the SASS tests
compile a few for sm_90a and find the wait (``ACQBULK``) before the release (``PREEXIT``), both before the
first global load or store, and neither without PDL. Numerics under PDL: the device tests
(``deepinfer_nvidia/tests/test_conformance_pdl.py``)."""
from __future__ import annotations

import ast
import pathlib

import pytest

triton = pytest.importorskip("triton")
pdl = pytest.importorskip("deepinfer_nvidia.kernels.triton_pdl")

from deepinfer_nvidia.kernels import _common  # noqa: E402

KERNELS = pathlib.Path(pdl.__file__).parent


def _jit_functions(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            yield node


def _body_without_docstring(fn: ast.FunctionDef) -> list[ast.stmt]:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    return body


def _pdl_kernels() -> dict[str, list[tuple[str, ast.Module]]]:
    found: dict[str, list[tuple[str, ast.Module]]] = {}
    for path in sorted(KERNELS.glob("*.py")):
        if path.name == "triton_pdl.py":  # the helpers themselves
            continue
        tree = ast.parse(path.read_text())
        for fn in _jit_functions(tree):
            if any(a.arg == "PDL" for a in fn.args.args + fn.args.kwonlyargs):
                found.setdefault(path.name, []).append((fn.name, tree))
    return found


def test_step_kernels_take_part():
    names = {n for kernels in _pdl_kernels().values() for n, _ in kernels}
    for kernel in ("_rms_kernel", "_rope_kernel", "_proj_kernel", "_gate_kernel", "_collapse_kernel",
                   "_expand_kernel", "_attn_kernel", "_merge_kernel", "_topk_kernel", "_scores_kernel",
                   "_align_sort_kernel", "_sum_slices_kernel", "_write_rows_kernel", "_swap_kernel",
                   "_wgmma_gemv_kernel", "_engram_gate_kernel", "_rms_rope_kernel", "_swiglu_kernel",
                   "_entry_slots_kernel", "_window_kernel", "_route_align_kernel"):
        assert kernel in names, kernel


def test_every_pdl_kernel_waits_first_and_every_launch_passes_the_option():
    for fname, kernels in _pdl_kernels().items():
        for name, tree in kernels:
            fn = next(f for f in _jit_functions(tree) if f.name == name)
            first = ast.unparse(_body_without_docstring(fn)[0])
            if name in ("_wgmma_gemv_kernel", "_w8a8_gemv_kernel"):  # request weights (never written) before
                continue  # their wait: their own tests (test_gluon_fp8_gemv_sass, test_gluon_w8a8_gemv)
            forms = ["pdl_enter(PDL)", "if PDL:\n    _grid_dependency(True)\n    _grid_dependency(False)"]
            if name == "_swap_pair_kernel":  # EARLY_W: its down launch asks for weights before the wait (its own
                # SASS test: test_gluon_swap_pair_sass.py); otherwise the same first statement
                forms.append("if PDL and (not EARLY_W):\n    _grid_dependency(True)\n    _grid_dependency(False)")
            body = _body_without_docstring(fn)
            if name == "_dense_gemv_kernel":  # EARLY: an L2 prefetch of its weights, then the wait (SASS test below)
                assert ast.unparse(body[0]).startswith("if PDL and EARLY:\n    _prefetch_first_tile("), (fname, name)
                first = ast.unparse(body[1])
            assert first in forms, (fname, name, first)
            launches = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Subscript)
                        and ast.unparse(c.func.value) == name]
            assert launches, (fname, name)
            for call in launches:
                text = ast.unparse(call)
                assert "pdl_launch()" in text or "launch_pdl" in text, (fname, name, text[:200])


def test_kernels_launched_with_the_switch_default_pdl_to_off():
    """``pdl_launch()`` is ``{}`` with ``DEEPINFER_NV_PDL=0``, so a kernel launched with it must default ``PDL`` to 0
    (``_swap_pair_kernel`` lacked the default and failed every launch with PDL off: twenty-sixth pass)."""
    for fname, kernels in _pdl_kernels().items():
        for name, tree in kernels:
            fn = next(f for f in _jit_functions(tree) if f.name == name)
            launches = [ast.unparse(c) for c in ast.walk(tree) if isinstance(c, ast.Call)
                        and isinstance(c.func, ast.Subscript) and ast.unparse(c.func.value) == name]
            if not any("**pdl_launch()" in text for text in launches):
                continue
            params = fn.args.args + fn.args.kwonlyargs
            defaults = dict(zip([a.arg for a in fn.args.args][::-1], fn.args.defaults[::-1]))
            defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None})
            assert "PDL" in defaults and ast.unparse(defaults["PDL"]) == "0", (fname, name, [a.arg for a in params])


def test_pdl_launch_follows_the_switch(monkeypatch):
    monkeypatch.setattr(_common, "PDL", 1)
    monkeypatch.setattr(pdl, "_platform_ok", lambda: True)
    assert pdl.pdl_launch() == {"PDL": 1, "launch_pdl": True}
    monkeypatch.setattr(_common, "PDL", 0)
    assert pdl.pdl_launch() == {}
    monkeypatch.setattr(_common, "PDL", 1)
    monkeypatch.setattr(pdl, "_platform_ok", lambda: False)  # interpreter, no GPU, or before SM90
    assert pdl.pdl_launch() == {}


def test_platform_check_on_this_machine():
    pdl._platform_ok.cache_clear()
    try:
        import torch

        want = (not pdl._interpreting() and torch.cuda.is_available()
                and torch.cuda.get_device_capability()[0] >= 9)
        assert pdl._platform_ok() == want
    finally:
        pdl._platform_ok.cache_clear()


def _cases():
    from deepinfer_nvidia.kernels import (triton_engram_window, triton_entry_slots, triton_gemm, triton_mhc,
                                          triton_norm, triton_rope, triton_route_align, triton_swiglu)

    route_align = (triton_route_align._route_align_kernel,
                   {"lg_ptr": "*fp32", "b_ptr": "*fp32", "w_ptr": "*fp32", "ids_ptr": "*i64", "pair_ptr": "*i32",
                    "bexp_ptr": "*i32", "x_ptr": "*bf16", "xp_ptr": "*bf16", "E": "i32", "XN": "i32", "KD": "i32",
                    "NROWS": "i32", "NB": "i32", "scaling": "fp32"},
                   {"K": 6, "BLOCK_E": 512, "BLOCK_K": 8, "BLOCK_M": 8, "PERM": 2, "XB": 1024, "RB": 64}, 4)
    return {
        "rms": (triton_norm._rms_kernel, {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "n_rows": "i32",
                                          "n_cols": "i32", "eps": "fp32"},
                {"HAS_W": 1, "ROWS": 2, "BLOCK": 4096}, 8),
        "collapse": (triton_mhc._collapse_kernel, {"r_ptr": "*bf16", "pre_ptr": "*fp32", "out_ptr": "*bf16",
                                                   "n": "i32", "D": "i32"}, {"NP": 4, "BLOCK_D": 1024}, 4),
        "rms_rope": (triton_rope._rms_rope_kernel, {"x_ptr": "*bf16", "w_ptr": "*fp32", "y_ptr": "*bf16",
                                                   "pos_ptr": "*i64", "f_ptr": "*fp32", "n_rows": "i32", "D": "i32",
                                                   "eps": "fp32"}, {"HALF": 32, "BLOCK": 512, "BLOCK_H": 32}, 4),
        "sum_slices": (triton_gemm._sum_slices_kernel, {"src_ptr": "*fp32", "dst_ptr": "*bf16", "N": "i32",
                                                        "S": "i32", "stride_s": "i32", "stride_m": "i32"},
                       {"BLOCK": 1024}, 4),
        "swiglu": (triton_swiglu._swiglu_kernel, {"g_ptr": "*bf16", "u_ptr": "*bf16", "y_ptr": "*bf16", "n_cols": "i32",
                                                  "stride_g": "i32", "stride_u": "i32", "limit": "fp32"},
                   {"UP64": 0, "BLOCK": 1024}, 4),
        "entry_slots": (triton_entry_slots._entry_slots_kernel, {"vis_ptr": "*i64", "sel_ptr": "*i64", "out_ptr": "*i64",
                                                                 "n": "i32", "k": "i32", "stride_v": "i32",
                                                                 "stride_s": "i32"}, {"BLOCK": 512}, 4),
        "engram_window": (triton_engram_window._window_kernel, {"ids_ptr": "*i64", "pos_ptr": "*i64",
                                                                "start_ptr": "*i64", "slot_ptr": "*i64",
                                                                "hist_ptr": "*i64", "win_ptr": "*i64", "valid_ptr": "*i1",
                                                                "N": "i32", "C": "i32", "stride_h": "i32"},
                          {"NP": 4}, 1),
        # the expand with the MoE's two parts (routed and shared) added in fp32
        "expand_parts": (triton_mhc._expand_kernel, {"r_ptr": "*bf16", "y_ptr": "*bf16", "y2_ptr": "*bf16",
                                                     "post_ptr": "*fp32", "comb_ptr": "*fp32", "out_ptr": "*bf16",
                                                     "n": "i32", "D": "i32"},
                         {"NP": 4, "BLOCK_D": 512, "TWO_PARTS": 1}, 4),
        # the one-token route and layout (the fragment K order, the bit-reversed one, and one expert a token)
        "route_align": route_align,
        "route_align_perm1": (*route_align[:2], dict(route_align[2], PERM=1), 4),
        "route_align_k1": (*route_align[:2], dict(route_align[2], K=1, BLOCK_K=1), 4),
    }


@pytest.mark.parametrize("case", ["rms", "collapse", "sum_slices", "rms_rope", "swiglu", "entry_slots",
                                  "engram_window", "expand_parts", "route_align", "route_align_perm1",
                                  "route_align_k1"])
def test_wait_then_release_before_any_global_access(case):
    from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes

    from deepinfer_nvidia.kernels import triton_norm
    if missing_tools(triton_norm):
        pytest.skip(missing_tools(triton_norm))
    fn, sig, consts, warps = _cases()[case]
    plain = opcodes(count(fn, sig, dict(consts, PDL=0), warps=warps)["sass"])
    assert not {"ACQBULK", "PREEXIT"} & set(plain)
    ops = opcodes(count(fn, sig, dict(consts, PDL=1), warps=warps)["sass"])
    assert ops.count("ACQBULK") == 1 and ops.count("PREEXIT") == 1, ops
    first_access = min(i for i, o in enumerate(ops) if o.startswith(("LDG", "STG", "LD.", "ST.")))
    assert ops.index("ACQBULK") < ops.index("PREEXIT") < first_access, ops[:first_access + 1]


def test_dense_gemv_asks_l2_for_its_weights_before_the_wait_only_when_early():
    """``triton_dense_gemv.EARLY_L2``: line prefetches (``CCTL``) of the program's first weight tile come before the
    wait (``ACQBULK``) under PDL; without EARLY nothing is asked before it."""
    from deepinfer_nvidia.kernels import triton_dense_gemv as dg
    from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes

    if missing_tools(dg):
        pytest.skip(missing_tools(dg))
    sig = {"x_ptr": "*bf16", "w_ptr": "*fp32", "y_ptr": "*fp32", "part_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32",
           "N": "i32", "K": "i32", "stride_x": "i32", "stride_w": "i32", "k_per_split": "i32"}
    consts = {"SPLIT": 10, "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 512, "PDL": 1, "WIDEN": 1}

    def before_wait(early):
        ops = opcodes(count(dg._dense_gemv_kernel, sig, dict(consts, EARLY=early), warps=4)["sass"])
        acq = ops.index("ACQBULK")
        assert ops.count("ACQBULK") == 1 and acq < ops.index("PREEXIT")
        return [o for o in ops[:acq] if o.startswith(("CCTL", "LDG", "STG"))]
    early = before_wait(1)
    assert early and all(o.startswith("CCTL") for o in early), early
    assert before_wait(0) == []
