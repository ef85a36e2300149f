"""NvidiaPlatform and CudaGraphRunner on a real GPU (skipped without one)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def test_detect_and_platform():
    import deepinfer_nvidia
    from deepinfer_nvidia.platform import NvidiaPlatform, capabilities_for

    assert deepinfer_nvidia.detect() == "deepinfer_nvidia.platform:NvidiaPlatform"
    p = NvidiaPlatform()
    major, minor = torch.cuda.get_device_capability()
    assert p.capabilities == capabilities_for(major, minor)
    assert p.device(0) == torch.device("cuda", 0)
    free, total = torch.cuda.mem_get_info()
    assert p.total_memory_bytes() == total and 0 < free <= total
    x = torch.ones(1 << 20, device="cuda")
    p.synchronize()
    assert float(x.sum()) == float(1 << 20)


def test_register_kernels_into_real_registry():
    from deepinfer_core.kernels.ops.norm import OPS
    from deepinfer_core.kernels.registry import KernelRegistry
    from deepinfer_nvidia.kernels import IMPLS
    from deepinfer_nvidia.platform import NvidiaPlatform

    reg = KernelRegistry()
    for spec in OPS:
        reg.register_op(spec)
    known = {op for op, *_ in IMPLS}
    if not known <= set(reg.ops()):
        pytest.skip("IMPLS names ops outside the norm family; the full-registry test covers them")
    NvidiaPlatform().register_kernels(reg)
    for op, provider, *_ in IMPLS:
        assert provider in reg.providers(op)


def test_graph_runner_matches_eager_and_replays_new_data():
    from deepinfer_nvidia.platform import NvidiaPlatform

    def step(x, w, eps):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype), x.sum(-1)

    runner = NvidiaPlatform().graph_runner(step)
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.rand(256, device="cuda", generator=g)
    for rows in (4, 16, 4):
        for _ in range(3):
            x = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16, generator=g)
            got = runner(x, w, 1e-6)
            want = step(x, w, 1e-6)
            torch.testing.assert_close(got[0], want[0])
            torch.testing.assert_close(got[1], want[1])
    assert runner.num_graphs == 2  # rows 4 and 16; the second rows=4 pass replays
    with pytest.raises(ValueError, match="device tensors"):
        runner(torch.randn(3, 256), w.cpu(), 1e-6)
