"""Engine configuration: small frozen dataclasses, ``"auto"`` resolved before construction."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "half": torch.float16}


def parse_dtype(dtype: str | torch.dtype, model_default: str = "bfloat16") -> torch.dtype:
    """``"auto"`` -> the checkpoint's ``torch_dtype``; names or torch dtypes otherwise."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = model_default if dtype == "auto" else dtype
    try:
        return _DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}") from None


@dataclass(frozen=True)
class EngineConfig:
    """What ``LLM(...)`` / ``LLMEngine`` run with (vLLM names where vLLM has one).

    kv_cache_memory_bytes: the KV-cache budget (paged blocks); None = 1 GiB on
    platforms without device memory queries, else ``gpu_memory_utilization`` of free memory.
    host_kv_cache_bytes: host-memory budget of the prefix cache's second tier (evicted cached
    blocks are spilled there and copied back on a hit; docs/prefix_caching.md); 0 = off.
    prefix_replay: how a prefix hit restores sliding-window state. ``"exact"`` (default): sliding
    blocks are cached like any block and the hit is bit-identical to a cold prefill; ``"bounded"``:
    sliding blocks are never cached (less memory) and the last ``min(window, hit)`` tokens are
    recomputed with windows floored at the replay start (approximate; docs/prefix_caching.md).
    decoder_replay: V4.1 decoder-side replay (layers from the last kv-source layer on run only on
    each request's last window of rows in prefill steps; approximate); None = on iff
    ``prefix_replay == "bounded"``.
    prefix_replay_window: bounded mode: tokens a hit recomputes with floored windows; None = the
    model's sliding window (the references' choice); longer replays are closer to exact.
    """

    model: str
    dtype: torch.dtype = torch.bfloat16
    max_model_len: int = 4096
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    async_scheduling: bool = True
    chain_steps: bool = True  # async: launch simple steps behind the running one (model_runner.py)
    block_size: int = 64
    kv_cache_memory_bytes: int | None = None
    host_kv_cache_bytes: int = 0  # prefix-cache host tier (spill evicted blocks to RAM); 0 = off
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    kernel_overrides: dict = field(default_factory=dict)
    tokenizer: str | None = None
    revision: str | None = None
    disable_log_stats: bool = True
    batch_invariant: bool = False  # also DEEPINFER_BATCH_INVARIANT=1; see docs/determinism.md
    enable_prefix_caching: bool = True  # see docs/prefix_caching.md
    prefix_replay: str = "exact"  # "exact" | "bounded" (SWA bounded replay)
    decoder_replay: bool | None = None  # None: follows prefix_replay == "bounded"
    prefix_replay_window: int | None = None  # bounded: replay length; None = the sliding window
    speculative_config: object = None  # dict / SpeculativeConfig; see docs/speculative_decoding.md
    enforce_eager: bool = False  # never replay decode steps from captured graphs (platforms that have them)
    graph_capture_sizes: tuple = ()  # batch buckets of captured decode steps; () = decode_graphs.DEFAULT_BATCH_SIZES

    @property
    def use_decoder_replay(self) -> bool:
        return self.prefix_replay == "bounded" if self.decoder_replay is None else self.decoder_replay

    def __post_init__(self) -> None:
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be positive, got {self.kv_cache_memory_bytes}")
        h = self.host_kv_cache_bytes
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise ValueError(f"host_kv_cache_bytes must be an int >= 0 (0 = off), got {h!r}")
        if self.prefix_replay not in ("exact", "bounded"):
            raise ValueError(f"prefix_replay must be 'exact' or 'bounded', got {self.prefix_replay!r}")
        if self.decoder_replay not in (None, True, False):
            raise ValueError(f"decoder_replay must be None, True or False, got {self.decoder_replay!r}")
        w = self.prefix_replay_window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"prefix_replay_window must be None or a positive int, got {w!r}")
        if self.decoder_replay and self.enable_prefix_caching and self.prefix_replay == "exact":
            # trimmed rows leave no late-layer window KV, which exact hits would read from cached sliding blocks
            raise ValueError("decoder_replay=True needs prefix_replay='bounded' or enable_prefix_caching=False "
                             "(exact hits read cached sliding-window KV that decoder replay does not write)")
        for name in ("enforce_eager", "chain_steps"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        sizes = self.graph_capture_sizes
        if not isinstance(sizes, (tuple, list)) or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                                       for b in sizes):
            raise ValueError(f"graph_capture_sizes must be a list of positive ints, got {sizes!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
