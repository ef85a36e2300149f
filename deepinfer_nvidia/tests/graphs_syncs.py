"""Which op of a decode step cannot be captured: run the padded static-shape decode step of tiny
checkpoints (MXFP4 V4.1, FP8 V4, the unquantised agreeing V4.1 one) eagerly under ``torch.cuda.set_sync_debug_mode("error")`` and print the first host sync.

    python3 -m deepinfer_nvidia.tests.graphs_syncs
"""
from __future__ import annotations

import tempfile
import traceback

import torch

from deepinfer_core import LLM, SamplingParams
from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint
from deepinfer_models.testing import write_tiny_v4_checkpoint


def probe(path, dtype):
    from deepinfer_nvidia.platform import NvidiaPlatform

    llm = LLM(str(path), dtype=dtype, max_model_len=1024, max_num_seqs=8, kv_cache_memory_bytes=1 << 30,
              platform=NvidiaPlatform(), enforce_eager=True)
    ex = llm.llm_engine.executor
    print("kernels:", {k: getattr(v, "__module__", "?") + "." + getattr(v, "__name__", type(v).__name__)
                       for k, v in getattr(llm.llm_engine.model, "k", {}).items()})
    from deepinfer_core.runner.decode_graphs import DecodeGraphs

    g = DecodeGraphs(ex, lambda fn: fn, (4,), 1024)
    g.strict = True
    llm.generate([[5] * 20], SamplingParams(max_tokens=2), use_tqdm=False)
    from deepinfer_core.runner.context import SeqSlice

    tables = {gid: [1, 2, 3] for gid in ex.group_specs}
    slices = [SeqSlice(20, 1, tables, state_slot=0)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            g.run(torch.tensor([7]), slices)
        print(path, dtype, "no host sync in the static decode step")
    except Exception:  # noqa: BLE001
        traceback.print_exc(limit=-4)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def main():
    root = tempfile.mkdtemp()
    v41 = write_tiny_v41_checkpoint(f"{root}/v41", tiny_v41_config("mixed"), quant="fp4", seed=2)
    v4 = write_tiny_v4_checkpoint(f"{root}/v4", quant="fp8", seed=1)
    from deepinfer_models.deepseek_v41.agreeing_checkpoint import write_agreeing_v41_checkpoint

    agree = f"{root}/agree"  # unquantised weights: the checkpoint whose capture failed on the H200
    write_agreeing_v41_checkpoint(agree)
    for p, dtype in ((v41, "float32"), (v4, "float32"), (agree, "float32"), (agree, "bfloat16")):
        probe(p, dtype)


if __name__ == "__main__":
    main()
