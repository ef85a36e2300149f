"""Engram n-gram memory (DeepSeek-V4.1): hash ids, table lookup, gated injection.

MODEL_SPEC.md 3.9. An Engram layer hashes the n-grams ending at each token (2-grams up to
N-grams, ``n_heads`` hashes each) into rows of a large FP8 table, projects the looked-up
rows to one key per hyper-connection stream plus a shared value, and adds the value to
each stream scaled by a sigmoid gate of a normalised stream/key dot product.

All three ops are row-wise: integer hashing is exact, the lookup only gathers and
scales by powers of two, and the gate is evaluated one precision up (``linalg.up``), so
a token's result never depends on the rest of the batch.
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.linalg import down, up
from deepinfer_core.kernels.ops.quant import ue8m0_to_float
from deepinfer_core.kernels.spec import OpSpec, acc

SCALE_GROUP = 32  # one UE8M0 scale per 32 table values


def window_ids(input_ids: torch.Tensor, positions: torch.Tensor, start: torch.Tensor, slot: torch.Tensor,
               history: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The n-gram window of every token of a step: ``(window [T, n] int64, valid [T, n] bool)``, column s the token
    id at position p-s. input_ids / positions / start / slot [T] int64 (start: the first position of the token's
    slice in this step; slot: its request's state slot, rows of one slice contiguous in step order); history
    [S, C] int64, each slot's token id of position q at ``q % C`` (written after this step reads it). Position
    p-s comes from this step's row t-s when it is in the slice (``p-s >= start``), else from the history; valid
    where p-s >= 0 (the window value there is any in-range history entry)."""
    s = torch.arange(n, device=positions.device)
    q = positions[:, None] - s[None, :]  # [T, n] position of each column
    t_rows = (torch.arange(positions.shape[0], device=positions.device)[:, None] - s[None, :]).clamp(min=0)
    past = history[slot].gather(1, q.remainder(history.shape[1]))
    return torch.where(q >= start[:, None], input_ids[t_rows], past), q >= 0


def hash_ids(window: torch.Tensor, valid: torch.Tensor, token_map: torch.Tensor, pad_id: int,
             multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Table rows of every n-gram hash of each token.

    window [T, N] int64: column s holds the token id at position p-s (any value where
    invalid); valid [T, N] bool: position p-s exists (once a column is invalid, all later
    columns are treated as invalid too); token_map [V] int64 (token id -> compressed id);
    pad_id: compressed id used for missing positions; multipliers [L, N] int64 (odd);
    primes / offsets [L, (N-1)*H] int64 in column order ``c = (s-1)*H + h``.
    Returns int64 [T, L, (N-1)*H]: ``(xor_{s'<=s} v_{s'} * mult[l, s']) % prime[l, c] + offset[l, c]``.
    """
    t, n = window.shape
    nl, cols = primes.shape
    heads = cols // (n - 1)
    blocked = ~(valid.to(torch.long).cumprod(dim=1).bool())
    mapped = token_map[window.clamp(min=0, max=token_map.shape[0] - 1)]
    v = torch.where(blocked, torch.full_like(window, pad_id), mapped)
    prod = v[:, None, :] * multipliers.to(v.device)[None, :, :]  # [T, L, N]; < 2^63 by construction
    rolling = prod[..., 0]
    out = []
    pr = primes.to(v.device).view(nl, n - 1, heads)
    for s in range(1, n):
        rolling = torch.bitwise_xor(rolling, prod[..., s])
        out.append(rolling[..., None] % pr[None, :, s - 1, :])
    return torch.cat(out, dim=-1) + offsets.to(v.device)[None]


def gather_rows(table: torch.Tensor, scale: torch.Tensor | None, ids: torch.Tensor,
                out_dtype: torch.dtype) -> torch.Tensor:
    """Dequantised table rows. table [R, hd] float8_e4m3fn (with scale [R, hd/32] UE8M0 as
    float8_e8m0fnu or raw uint8) or a float dtype (scale None); ids [...] int64 row ids.
    Returns ``table[ids] * 2^(scale[ids] - 127)`` per group of 32 values, shape [..., hd], ``out_dtype``.
    """
    rows = table[ids].float()
    if scale is None:
        return rows.to(out_dtype)
    s = ue8m0_to_float(scale[ids])  # [..., hd/32]
    return (rows * s.repeat_interleave(SCALE_GROUP, dim=-1)).to(out_dtype)


def gate(residual: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
         eps: float, clamp: float) -> torch.Tensor:
    """Gated Engram injection into every hyper-connection stream.

    residual [T, n, D]; kv [T, (n+1)*D] = n keys then the shared value; q_weight, k_weight [n, D].
    Per stream k: ``dot = sum_d(R_k * q_w[k] * k_w[k] * key_k) * rsqrt(mean(R_k^2)+eps) *
    rsqrt(mean(key_k^2)+eps) / sqrt(D)``, ``g = sigmoid(sign(dot) * sqrt(max(|dot|, clamp)))``
    (sign(0) = +), ``R_k + g * value``. Computed one precision up, returned in residual.dtype.
    """
    t, n, d = residual.shape
    h = up(acc(residual))
    kvu = up(acc(kv))
    key, value = kvu[:, : n * d].view(t, n, d), kvu[:, n * d:]
    w = up(acc(q_weight)) * up(acc(k_weight))
    rstd = torch.rsqrt(h.pow(2).mean(-1) + eps) * torch.rsqrt(key.pow(2).mean(-1) + eps)
    dot = (h * w[None] * key).sum(-1) * rstd * d ** -0.5
    mag = dot.abs().clamp(min=clamp).sqrt()
    g = torch.sigmoid(torch.where(dot < 0, -mag, mag))
    out = h + g[..., None] * value[:, None, :]
    return down(out, acc(residual)).to(residual.dtype)


# -- conformance generators ---------------------------------------------------------
def _gen_hash(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, n, heads, layers in [(5, 4, 2, 2), (17, 3, 8, 1)]:
        window = torch.randint(0, 500, (t, n), generator=g)
        valid = torch.ones(t, n, dtype=torch.bool)
        for i in range(min(t, n)):
            valid[i, i + 1:] = False
        token_map = torch.randint(0, 300, (500,), generator=g)
        mult = torch.randint(0, 2 ** 40, (layers, n), generator=g) * 2 + 1
        primes = torch.tensor([101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157, 163, 167, 173, 179]
                              )[: (n - 1) * heads].repeat(layers, 1)
        offsets = torch.cumsum(primes, dim=1) - primes
        yield (window.to(device), valid.to(device), token_map.to(device), 2, mult.to(device), primes.to(device),
               offsets.to(device)), {}


def _gen_window(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for lens, starts, n, cap in [([1], [0], 4, 16), ([1, 1, 1], [5, 0, 40], 4, 16), ([6, 1, 3], [0, 17, 2], 3, 8)]:
        slots = torch.randperm(9, generator=g)[: len(lens)]
        pos = torch.cat([torch.arange(st, st + ln) for st, ln in zip(starts, lens)])
        start = torch.cat([torch.full((ln,), st) for st, ln in zip(starts, lens)])
        slot = torch.cat([torch.full((ln,), int(sl)) for sl, ln in zip(slots, lens)])
        ids = torch.randint(0, 1000, (pos.shape[0],), generator=g)
        history = torch.randint(0, 1000, (9, cap), generator=g)
        yield tuple(v.to(device) for v in (ids, pos, start, slot, history)) + (n,), {}


def _compare_window(out, ref, dtype):
    (w, v), (wr, vr) = out, ref
    assert torch.equal(v.cpu(), vr.cpu()), "valid masks differ"
    assert torch.equal(torch.where(vr, w, 0).cpu(), torch.where(vr, wr, 0).cpu()), "window ids differ"


def _gen_gather(dtype, device, seed):
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    g = torch.Generator().manual_seed(seed)
    for rows, hd in [(50, 32), (300, 64)]:
        w = torch.randn(rows, hd, generator=g)
        # per-row groups of 32: a [1, 32] block quantiser gives exactly the table format
        q, s = quant_fp8_block(w, (1, SCALE_GROUP), "ue8m0")
        ids = torch.randint(0, rows, (7, 3), generator=g)
        yield (q.to(device), s.to(device), ids.to(device), dtype), {}
        yield (w.to(dtype).to(device), None, ids.to(device), dtype), {}


def _gen_gate(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, n, d in [(3, 4, 16), (9, 4, 64), (2, 2, 32)]:
        r = torch.randn(t, n, d, generator=g).to(dtype).to(device)
        kv = torch.randn(t, (n + 1) * d, generator=g).to(dtype).to(device)
        qw = (1 + 0.1 * torch.randn(n, d, generator=g)).to(dtype).to(device)
        kw = (1 + 0.1 * torch.randn(n, d, generator=g)).to(dtype).to(device)
        yield (r, kv, qw, kw, 1e-6, 1e-6), {}


OPS = [
    OpSpec("engram.window", window_ids, _gen_window, compare=_compare_window,
           doc="the n-gram window of each token from this step and the request's history"),
    OpSpec("engram.hash_ids", hash_ids, _gen_hash, doc="n-gram hash ids into each Engram table"),
    OpSpec("engram.gather", gather_rows, _gen_gather, doc="dequantised Engram table rows"),
    OpSpec("engram.gate", gate, _gen_gate, tolerances={torch.bfloat16: (3e-2, 3e-2)},
           doc="gated Engram value added to every hyper-connection stream"),
]
