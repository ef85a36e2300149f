"""Per-step overhead of structured outputs at batch 64 with the real V4 vocabulary (CPU).

    python benchmarks/structured_overhead.py [--batch 64] [--model deepinfer/tiny-v4]

Measures (1) filling the token bitmask for `batch` JSON-schema matchers, (2) applying it
to fp32 logits [batch, 129280] through the registry op, and (3) one decode step of the
same model at the same batch without constraints, then prints the overhead as a fraction
of the decode step.
"""
from __future__ import annotations

import argparse
import time

import torch


def timeit(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--model", default="deepinfer/tiny-v4")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from deepinfer_core import LLM, SamplingParams
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.structured import StructuredOutputsParams
    from deepinfer_core.structured.xgrammar_backend import GrammarBackend

    llm = LLM(a.model, dtype="float32", max_model_len=256, max_num_seqs=a.batch)
    eng = llm.llm_engine
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    backend = GrammarBackend(eng.tokenizer, eng.vocab_size, list(eng.eos_token_ids))
    compiled = backend.compile(StructuredOutputsParams(json=schema))
    matchers = [backend.matcher(compiled) for _ in range(a.batch)]
    for m in matchers:  # move past the first token so the masks are not trivial
        m.accept_string('{"name": "a')
    rows = list(range(a.batch))
    fill = timeit(lambda: backend.fill_bitmask(matchers, rows, a.batch), 20)
    bitmask = backend.fill_bitmask(matchers, rows, a.batch)
    apply = get_registry().impl("structured.apply_bitmask", "reference")
    logits = torch.randn(a.batch, eng.vocab_size)
    app = timeit(lambda: apply(logits, bitmask), 20)

    # one decode step at the same batch: run prefill, then time engine steps of pure decode
    g = torch.Generator().manual_seed(0)
    for i in range(a.batch):
        eng.add_request(f"r{i}", torch.randint(3, 129000, (16,), generator=g).tolist(),
                        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    for _ in range(3):
        eng.step()
    t0 = time.perf_counter()
    n = 10
    for _ in range(n):
        eng.step()
    step = (time.perf_counter() - t0) / n
    while eng.has_unfinished_requests():
        eng.step()
    print(f"batch={a.batch} vocab={eng.vocab_size} threads={torch.get_num_threads()}")
    print(f"bitmask fill   {fill * 1e3:8.2f} ms/step")
    print(f"bitmask apply  {app * 1e3:8.2f} ms/step")
    print(f"decode step    {step * 1e3:8.2f} ms/step (tiny model, unconstrained)")
    print(f"overhead       {(fill + app) / step * 100:8.1f} % of a decode step")


if __name__ == "__main__":
    main()
