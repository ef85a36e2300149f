"""Host-side layout helpers of the Gluon swap experts (``gluon_moe_swap``): pairs per block, the activations' K
order, and the TMA weight descriptors with the rule for when a stack can take them."""
from __future__ import annotations

import torch

try:  # Gluon is experimental: absent in older Triton (then no stack takes the TMA path)
    from triton.experimental.gluon import language as gl
    _GLUON = True
except ImportError:  # pragma: no cover - depends on the installed triton
    _GLUON = False


def block_m_for(pairs: int, experts: int) -> int:
    """Pairs per block: 16 up to a mean of 12 pairs per routed expert, 32 up to 24, else 64 (H200, V4.1 widths:
    32 won at a mean of 16 (6144 pairs: 3408 us, 16 rows 4072, 64 rows 4487), 64 at 128 (49152 pairs: 11649 us,
    128 rows through shared memory 12579))."""
    mean = pairs / max(1, min(experts, pairs))
    return 16 if mean <= 12 else 32 if mean <= 24 else 64


def permute_k(x: torch.Tensor, fragment: bool) -> torch.Tensor:
    """Activations ``[T, K]`` in the kernels' K order (a copy): the bit reversal of the low 3 bits of each column
    (``_decode``), or with ``fragment`` the A-fragment order of ``_decode_fragment`` per 128 columns."""
    t, k = x.shape
    if fragment:  # natural n = 32c + 8q + 4e + 2S + p -> logical (q, S, p, c, e)
        return x.reshape(t, k // 128, 4, 4, 2, 2, 2).permute(0, 1, 3, 5, 6, 2, 4).reshape(t, k)
    return x.reshape(t, k // 8, 2, 2, 2).permute(0, 1, 4, 3, 2).reshape(t, k)


def tma_fits(w: torch.Tensor, block_n: int, block_k: int) -> bool:
    """Whether a packed stack ``w [E, N, K/2]`` can feed the TMA weight path with these tiles: N a multiple of
    ``block_n`` (a box never crosses into the next expert), K/2 bytes a row a multiple of 16 and the base 16-byte
    aligned (the descriptor's rules), and ``block_k`` a multiple of 32."""
    e, n, half = w.shape
    return (_GLUON and n % block_n == 0 and half % 16 == 0 and block_k % 32 == 0 and w.is_contiguous()
            and w.data_ptr() % 16 == 0)


def weight_desc_layout():
    """The shared layout of a TMA weight box: row-major, unswizzled bytes (the ring's layout)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=3)


def _weight_descs(wa: torch.Tensor, wb: torch.Tensor | None, block_n: int, block_k: int):
    """TMA descriptors of uint8 stacks [E, N, K/2] viewed as [E*N, K/32, 16], boxes [block_n, block_k/32, 16]."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    def desc(w):
        e, n, half = w.shape
        return TensorDescriptor.from_tensor(w.view(e * n, half // 16, 16), [block_n, block_k // 32, 16],
                                            weight_desc_layout())

    da = desc(wa)
    return da, (desc(wb) if wb is not None else da)
