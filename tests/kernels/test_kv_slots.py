"""``kv.sliding_slots`` / ``kv.compressed_slots``: the references against a per-token Python loop written from the
cache layout (docs/architecture.md), their errors, the engine's use of the resolved ops, and the Triton kernels
in Triton's CPU interpreter against the references."""
from __future__ import annotations


import pytest
import torch

from deepinfer_core.kernels.ops.kv import _gen_compressed, _gen_sliding, compressed_slots, sliding_slots


def sliding_loop(table, seq, pos, nwb, floor, bs, window):
    writes, reads = [], []
    for s, p, nw, fl in zip(seq.tolist(), pos.tolist(), nwb.tolist(), floor.tolist()):
        row = table[s].tolist()
        no_write = 0 if fl > 0 else nw
        writes.append(-1 if p < no_write else row[p // bs] * bs + p % bs)
        reads.append([row[q // bs] * bs + q % bs if q >= max(fl, 0) else -1 for q in range(p - window + 1, p + 1)])
    return torch.tensor(writes, dtype=torch.long), torch.tensor(reads, dtype=torch.long).view(len(writes), window)


def compressed_loop(table, seq, pos, nwb, r, epb, bs, width):
    writes, reads = [], []
    last = table.shape[1] - 1
    for s, p, nw in zip(seq.tolist(), pos.tolist(), nwb.tolist()):
        row = table[s].tolist()
        e = p // r
        writes.append(row[min(e * r // bs, last)] * epb + e % epb if (p + 1) % r == 0 and p >= nw else -1)
        reads.append([row[min(g * r // bs, last)] * epb + g % epb if g < (p + 1) // r else -1 for g in range(width)])
    return torch.tensor(writes, dtype=torch.long), torch.tensor(reads, dtype=torch.long).view(len(writes), width)


def test_references_match_the_loop():
    n = 0
    for seed in range(3):
        for args, _ in _gen_sliding(None, "cpu", seed):
            for got, want in zip(sliding_slots(*args), sliding_loop(*args)):
                assert torch.equal(got, want), (seed, n)
            n += 1
        for args, _ in _gen_compressed(None, "cpu", seed):
            for got, want in zip(compressed_slots(*args), compressed_loop(*args)):
                assert torch.equal(got, want), (seed, n)
            n += 1
    assert n == 27


def test_errors_name_the_operand():
    t = torch.zeros(3, dtype=torch.long)
    table = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="table must be"):
        sliding_slots(table[0], t, t, t, t, 16, 8)
    with pytest.raises(ValueError, match="per-token inputs"):
        sliding_slots(table, t, t[:2], t, t, 16, 8)
    with pytest.raises(TypeError, match="int64 / int32"):
        compressed_slots(table, t, t.float(), t, 4, 4, 16, 8)
    with pytest.raises(ValueError, match="ratio"):
        compressed_slots(table, t, t, t, 0, 4, 16, 8)
    with pytest.raises(ValueError, match="window"):
        sliding_slots(table, t, t, t, t, 16, 0)


def test_engine_resolves_the_step_ops(tmp_path):
    """The engine resolves the executor's step ops for its platform (the references on the CPU), the executor
    holds them, and a generation runs through them."""
    from deepinfer_core import LLM, SamplingParams
    from deepinfer_core.runner.executor import STEP_KERNEL_OPS
    from deepinfer_models.deepseek_v41.checkpoint_writer import write_tiny_v41_checkpoint

    write_tiny_v41_checkpoint(tmp_path, quant="fp8", seed=3)
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 << 20)
    kernels = llm.llm_engine.executor.kernels
    assert set(kernels) == set(STEP_KERNEL_OPS)
    assert kernels["kv.sliding_slots"] is sliding_slots and kernels["kv.compressed_slots"] is compressed_slots
    out = llm.generate([[5, 6, 7, 8, 9, 10, 11, 12]], SamplingParams(max_tokens=4, temperature=0.0))
    assert len(out[0].outputs[0].token_ids) == 4


_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.kv import _gen_compressed, _gen_sliding, compressed_slots, sliding_slots
from deepinfer_nvidia.kernels import triton_kv as tk

n = 0
for seed in range(3):
    for args, _ in _gen_sliding(None, "cpu", seed):
        for got, want in zip(tk.sliding_slots(*args), sliding_slots(*args)):
            assert torch.equal(got, want), ("sliding", seed, n)
        n += 1
    for args, _ in _gen_compressed(None, "cpu", seed):
        for got, want in zip(tk.compressed_slots(*args), compressed_slots(*args)):
            assert torch.equal(got, want), ("compressed", seed, n)
        n += 1
# a wide window and a wide compressed read (several column tiles), int32 inputs
g = torch.Generator().manual_seed(9)
table = torch.randperm(4000, generator=g)[:3 * 40].view(3, 40)
seq, pos = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 130, 639, 300])
nwb, floor = torch.tensor([0, 64, 0, 400]), torch.tensor([0, 0, 500, 0])
for got, want in zip(tk.sliding_slots(table.int(), seq.int(), pos.int(), nwb.int(), floor.int(), 16, 300),
                     sliding_slots(table, seq, pos, nwb, floor, 16, 300)):
    assert torch.equal(got, want), "wide window"
for got, want in zip(tk.compressed_slots(table, seq, pos, nwb, 2, 8, 16, 330),
                     compressed_slots(table, seq, pos, nwb, 2, 8, 16, 330)):
    assert torch.equal(got, want), "wide compressed read"
print("INTERPRETED", n + 2)
"""


def test_triton_kernels_in_the_interpreter(run_interpreted):
    """The kernels against the references in ``TRITON_INTERPRET=1`` (own process: the flag is read when the
    kernels are decorated). Skipped when triton is not installed."""
    run_interpreted(_INTERPRETED, "INTERPRETED 29")
