"""Engram layers of DeepSeek-V4.1 (MODEL_SPEC.md 3.9), paged.

``EngramHasher`` computes, once per forward, the hash ids of every token for every Engram
layer: the n-gram ending at position p needs the token ids at p-1 .. p-(N-1), which may lie
in earlier steps, so each request keeps its recent token ids in a per-request ``StateSpec``
ring indexed by position (``p % HISTORY_CAP``); positions before 0 are "blocked" and hash as
padding. Indexing by position (not "the last N-1 ids") means tokens written at positions that
are later rejected (speculative decoding) are simply overwritten by the accepted ones.

``EngramLayer`` looks its ids up in the layer's table (FP8 rows with UE8M0 scales per 32
values, or plain floats in unquantised checkpoints), projects the concatenated rows with
``wkv`` to one key per hyper-connection stream plus a shared value, and adds the gated value
to each stream. The table may stay in host memory (memory-mapped from the safetensors file,
about 189 GiB on the real model): ids go to the table's device, only the gathered rows come back.
"""
from __future__ import annotations

import torch

from deepinfer_core.kv.spec import StateSpec
from deepinfer_core.runner.context import StepContext
from deepinfer_models.deepseek_v41.config import DeepseekV41Config
from deepinfer_models.deepseek_v41.engram_hash import engram_multipliers, engram_offsets, engram_primes
from deepinfer_models.deepseek_v41.step import StepRows
from deepinfer_models.layers.static_index import take_rows, write_rows

HISTORY = "engram.history"
HISTORY_CAP = 16  # >= N-1 + the most rejected speculative positions (N = 4: up to 12)
GATE_CLAMP = 1e-6  # |dot| floor before the signed square root (both serving stacks)


class EngramHasher:
    """Hash ids ``[T, n_engram_layers, (N-1)*n_heads]`` (global rows of each layer's table)."""

    def __init__(self, cfg: DeepseekV41Config, token_map: torch.Tensor, kernels: dict, device: torch.device):
        self.k = kernels
        self.n = cfg.engram_max_ngram_size
        self.token_map = token_map.to(device=device, dtype=torch.long)
        self.pad_id = int(self.token_map[cfg.engram_pad_token_id])
        primes = engram_primes(len(cfg.engram_layer_ids), self.n, cfg.engram_n_heads, cfg.engram_vocab_size)
        self.primes = torch.tensor(primes, dtype=torch.long, device=device)
        self.offsets = torch.tensor(engram_offsets(primes), dtype=torch.long, device=device)
        mult = engram_multipliers(tuple(cfg.engram_layer_ids), self.n, cfg.engram_compressed_vocab_size)
        self.multipliers = torch.tensor(mult, dtype=torch.long, device=device)
        if self.n - 1 > HISTORY_CAP:
            raise ValueError(f"engram_max_ngram_size={self.n} needs more than {HISTORY_CAP} history positions")
        self.spec = StateSpec(entry_shape=(HISTORY_CAP,), dtype=torch.long)

    def specs(self) -> dict[str, StateSpec]:
        return {HISTORY: self.spec}

    def __call__(self, input_ids: torch.Tensor, ctx: StepContext, rows: StepRows) -> torch.Tensor:
        n = self.n
        pos = ctx.positions
        history = ctx.caches[HISTORY]  # [slots, HISTORY_CAP] token id of position p at p % HISTORY_CAP
        # [T, N] token ids of positions p .. p-N+1: this step's rows, or the history (read before this step writes)
        window, valid = self.k["engram.window"](input_ids, pos, rows.start, rows.slot, history, n)
        ids = self.k["engram.hash_ids"](window, valid, self.token_map, self.pad_id, self.multipliers,
                                        self.primes, self.offsets)
        # remember the last HISTORY_CAP positions of every request's chunk
        keep, dest, valid = rows.ring_tail(ctx, HISTORY_CAP)
        ids_kept = take_rows(input_ids, keep)
        write_rows(history.view(-1), dest, ids_kept, valid)
        return ids


class EngramLayer:
    def __init__(self, cfg: DeepseekV41Config, layer: int, w: dict, make_linear, kernels: dict):
        p = f"layers.{layer}.engram"
        self.k, self.eps = kernels, cfg.rms_norm_eps
        self.col = cfg.engram_layer_ids.index(layer)  # this layer's slot in the hasher's output
        self.table = w[f"{p}.embed.weight"]
        self.scale = w.get(f"{p}.embed.scale")
        self.wkv = make_linear(f"{p}.wkv")
        self.q_weight = w[f"{p}.q_weight"].float()
        self.k_weight = w[f"{p}.k_weight"].float()

    def lookup(self, hash_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """hash_ids [T, L, C] -> kv [T, (n+1)*D] in ``dtype``: the layer's table rows projected by ``wkv``. It reads
        only the step's token ids, never the residual, so a model may run it as a ``stream.side`` branch from the
        step's start and join it where the layer injects (``DeepseekV41ForCausalLM``)."""
        ids = hash_ids[:, self.col].to(self.table.device)
        rows = self.k["engram.gather"](self.table, self.scale, ids, dtype).to(hash_ids.device)
        return self.wkv(rows.reshape(rows.shape[0], -1))

    def __call__(self, residual: torch.Tensor, hash_ids: torch.Tensor, kv: torch.Tensor | None = None) -> torch.Tensor:
        """residual [T, n, D], hash_ids [T, L, C] -> residual with the gated value added to each stream. ``kv``:
        ``lookup(hash_ids, residual.dtype)`` when the caller has it."""
        if kv is None:
            kv = self.lookup(hash_ids, residual.dtype)
        return self.k["engram.gate"](residual, kv, self.q_weight, self.k_weight, self.eps, GATE_CLAMP)
