"""The DeepSeek-V4.1-Flash slice of ``sweep.py --arch v41``: config, random native weights built on
the device, the bytes / FLOPs a step must at least move, and ``--save-checkpoint``.

Widths (MODEL_SPEC.md 1.2, the ``DeepseekV41Config`` defaults): hidden 5120, 64 heads x 512 (64
RoPE dims), q_lora 1280, o_groups 8 x o_lora 1024, window 128, 384 experts top-6 (moe_inter
2304, one shared expert), vocab 129280, mHC n=4 (20 Sinkhorn iterations, delayed pre), indexer
32 heads x 128 with top-512, candidate filter 2048 blocks of 8, Engram 8 heads x 256 (4-grams),
DSpark 3 stages of 5 drafts. Quant preset ``fp4`` (V4.1-Flash): e4m3 dense linears with one
UE8M0 scale per 32x32 block, MXFP4 experts (UE8M0 per 32), Engram rows e4m3 + UE8M0 per 32.

Topology (``v41_topology``). The real model (MODEL_SPEC.md 1.3) has nine kinds of layer; the
8-layer slice (the default) holds each of them once, in the real order:

    slice layer  ratio  role                                        real layers of that kind
    0            0      sliding window only                         0
    1            0      sliding window + Engram                     1
    2            2      kv + index source (compressor with gate,    2
                        pair ring, indexer owning the index keys)
    3            2      consumer of 2's cache and top-k             3-7, 9-13, 15-19
    4            2      index-only source (reads 2's keys) + Engram 8, 14 (Engram on 14)
    5            1      kv + index + candidate source               20
    6            1      consumer of 5's cache and top-k             21-23
    7            1      index source masked by 5's candidates       24, 28, 32, 36
    (8+)         1      consumers of 7's top-k                      25-27, 29-31, ...

``--layers N`` < 8 keeps the first N (a valid prefix: every source precedes its readers);
N > 8 appends ratio-1 consumers (the most common kind); N = 40 is the full inferred Flash
topology. DSpark target layers: ``(N//8, N//2, N-1)``.

Engram tables: the real tables have about 384M rows each (``engram_vocab_size`` ~16M, 98 GB per
table), more than one GPU holds; the slice uses ``engram_vocab_size = --engram-vocab`` (default
2^20: 25M rows, 6.6 GB per table). A step reads 24 rows per token per Engram layer whatever the
table size, so the roofline does not depend on it (tables bigger than L2 either way).

Weights: ``SliceWeights`` is the ``{native name: tensor}`` mapping the model constructor reads.
Everything but the routed experts is built once on the device; experts are generated when the
model asks for them (seeded by name, so identical on every call): ``MoEV4`` stacks the per-expert
tensors into its own copy, and keeping the per-expert originals as well would double the 7.2 GB
of experts per layer and no longer fit eight layers on one H200.
"""
from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

from benchmarks.sweep_slice import expected_distinct, random_tensor
from deepinfer_core.loader import INDEX_FILE, SINGLE_FILE, TensorSpec
from deepinfer_models.deepseek_v4.checkpoint_writer import TOKENIZER_FILES, tensor_seed, tokenizer_dir
from deepinfer_models.deepseek_v41.checkpoint_writer import QUANT_PRESETS, _all_specs, compressed_vocab_size
from deepinfer_models.deepseek_v41.config import DeepseekV41Config
from deepinfer_models.deepseek_v41.engram_hash import build_token_map, engram_primes, token_map_tensor
from deepinfer_models.deepseek_v41.weights import expected_tensors

CANONICAL_LAYERS = 8  # one layer of each kind (table above)
REAL_LAYERS = 40
FLASH_DSPARK = dict(n_mtp_layers=3, dspark_block_size=5, dspark_markov_rank=256, dspark_noise_token_id=128799)


# -- architecture ------------------------------------------------------------------------------
def v41_topology(layers: int) -> dict:
    """Layer-role fields of an ``layers``-layer slice (see the module docstring)."""
    if layers < 1:
        raise SystemExit(f"--layers must be >= 1, got {layers}")
    if layers == REAL_LAYERS:  # MODEL_SPEC.md 1.3 (inferred Flash topology)
        topo = dict(compress_ratios=(0, 0) + (2,) * 18 + (1,) * 20, kv_source_layer_ids=(2, 20),
                    index_source_layer_ids=(2, 8, 14, 20, 24, 28, 32, 36), candidate_source_layer_id=20,
                    engram_layer_ids=(1, 14))
    else:
        ratios = ((0, 0, 2, 2, 2, 1, 1, 1) + (1,) * layers)[:layers]
        keep = lambda ids: tuple(i for i in ids if i < layers)  # noqa: E731
        topo = dict(compress_ratios=ratios, kv_source_layer_ids=keep((2, 5)), index_source_layer_ids=keep((2, 4, 5, 7)),
                    candidate_source_layer_id=5 if layers > 5 else -1, engram_layer_ids=keep((1, 4)))
    targets = tuple(sorted({layers // 8, layers // 2, layers - 1}))
    return dict(num_hidden_layers=layers, dspark_target_layer_ids=targets, **topo)


def v41_slice(layers: int, ratios: list[int] | None = None, quant: str = "fp4", tiny: bool = False,
              engram_vocab: int = 1 << 20) -> DeepseekV41Config:
    """The V4.1-Flash config with ``layers`` layers (``ratios`` is V4's knob: the topology fixes them).

    ``tiny``: the tiny checkpoint writer's widths (hidden 64, 8 experts, window 16, ...) with the
    same topology, the real vocabulary (so the real tokenizer and ``LLM`` work on a saved slice).
    """
    topo = v41_topology(layers)
    q = QUANT_PRESETS[quant]
    if tiny:
        from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config

        return tiny_v41_config("flash", **topo, candidate_block_size=4, candidate_topk_blocks=3, index_topk=8,
                               sliding_window=16, quant=q)
    primes = engram_primes(len(topo["engram_layer_ids"]), 4, 8, engram_vocab)
    cfg = DeepseekV41Config(
        **topo, quant=q, candidate_block_size=8, candidate_topk_blocks=2048,
        engram_max_ngram_size=4, engram_n_heads=8, engram_head_dim=256, engram_vocab_size=engram_vocab,
        engram_num_embeddings=tuple(sum(p) for p in primes), engram_compressed_vocab_size=compressed_vocab_size(),
        rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                      "beta_fast": 32, "beta_slow": 1}, **FLASH_DSPARK)
    cfg.validate()
    return cfg


def describe(cfg: DeepseekV41Config) -> dict:
    """The topology fields ``sweep.json`` records."""
    return {"kv_sources": list(cfg.kv_source_layer_ids), "index_sources": list(cfg.index_source_layer_ids),
            "candidate_source": cfg.candidate_source_layer_id, "engram_layers": list(cfg.engram_layer_ids),
            "engram_rows": list(cfg.engram_num_embeddings), "q_lora": cfg.q_lora_rank,
            "moe_inter": cfg.moe_intermediate_size, "index_heads": cfg.index_n_heads, "index_topk": cfg.index_topk,
            "candidate_blocks": [cfg.candidate_topk_blocks, cfg.candidate_block_size],
            "dspark_targets": list(cfg.dspark_target_layer_ids)}


_TOKEN_MAPS: dict = {}


def token_map(cfg: DeepseekV41Config) -> torch.Tensor | None:
    """int64 [vocab] Engram token map from the bundled DeepSeek tokenizer (what ``loading.py`` builds)."""
    if not cfg.engram_layer_ids:
        return None
    if cfg.vocab_size not in _TOKEN_MAPS:
        tmap, n = build_token_map(tokenizer_dir() / "tokenizer.json")
        assert n == cfg.engram_compressed_vocab_size, (n, cfg.engram_compressed_vocab_size)
        _TOKEN_MAPS[cfg.vocab_size] = token_map_tensor(tmap, cfg.vocab_size, tmap[cfg.engram_pad_token_id])
    return _TOKEN_MAPS[cfg.vocab_size]


# -- weights -----------------------------------------------------------------------------------
ENGRAM_CHUNK_ROWS = 1 << 20  # bounds the fp32 transient of table generation (1 GB at 256 wide)


class SliceWeights(Mapping):
    """``{native name: tensor}`` of the slice on ``device``; routed experts generated on access.

    ``specs`` holds every name (target, plus the DSpark ``mtp.*`` stages when ``draft``), with the
    first allowed dtype of each ``TensorSpec`` (the one the checkpoint writers use).
    """

    def __init__(self, cfg: DeepseekV41Config, device: str, seed: int = 0, draft: bool = False):
        self.cfg, self.device, self.seed = cfg, device, seed
        self.specs: dict[str, TensorSpec] = _all_specs(cfg) if draft else dict(expected_tensors(cfg))
        self.target = set(expected_tensors(cfg))
        self.dense: dict[str, torch.Tensor] = {}
        self._stash: dict[str, torch.Tensor] = {}
        g = torch.Generator(device=device).manual_seed(seed)
        for name, spec in self.specs.items():
            if not is_expert(name) and spec.role not in ("fp8_scale", "mxfp4_scale", "engram_scale"):
                self.dense.update(self._make(name, spec, g))
        missing = {n for n in self.specs if not is_expert(n)} - set(self.dense)
        if missing:
            raise AssertionError(f"weights not built: {sorted(missing)[:5]}")

    def _make(self, name: str, spec: TensorSpec, g: torch.Generator) -> dict[str, torch.Tensor]:
        dev, leaf = self.device, name.rsplit(".", 1)[-1]
        if spec.role == "engram_table":
            return self._engram_table(name, spec, g)
        if spec.role == "engram_vec" or leaf in ("q_weight", "k_weight"):  # gate weights, around 1
            return {name: (torch.randn(spec.shape, generator=g, device=dev) * 0.1 + 1.0).to(spec.dtypes[0])}
        return random_tensor(name, spec, self.cfg, g, dev)

    def _engram_table(self, name: str, spec: TensorSpec, g: torch.Generator) -> dict[str, torch.Tensor]:
        """e4m3 rows ~N(0, 1) with every UE8M0 scale 2^-1 (values ~N(0, 0.5), as the tiny writer's)."""
        rows, hd = spec.shape
        table = torch.empty(spec.shape, dtype=spec.dtypes[0], device=self.device)
        for r0 in range(0, rows, ENGRAM_CHUNK_ROWS):
            n = min(ENGRAM_CHUNK_ROWS, rows - r0)
            std = 1.0 if self.cfg.quant.quantized else 0.5
            table[r0:r0 + n] = (torch.randn(n, hd, generator=g, device=self.device) * std).to(spec.dtypes[0])
        if not self.cfg.quant.quantized:
            return {name: table}
        scale = torch.full((rows, hd // 32), 126, dtype=torch.uint8, device=self.device)
        return {name: table, name[: -len(".weight")] + ".scale": scale.view(torch.float8_e8m0fnu)}

    def _expert(self, name: str) -> torch.Tensor:
        if name in self._stash:
            return self._stash.pop(name)
        stem = name.rsplit(".", 1)[0]
        wname = stem + ".weight"
        g = torch.Generator(device=self.device).manual_seed(tensor_seed(self.seed, wname))
        made = random_tensor(wname, self.specs[wname], self.cfg, g, self.device)
        out = made.pop(name)
        self._stash = made  # the scale (or weight) of the same expert, asked for next
        return out

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.dense:
            return self.dense[name]
        if name in self.specs and is_expert(name):
            return self._expert(name)
        raise KeyError(name)

    def __iter__(self):
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    def nbytes(self, names=None) -> int:
        """Native bytes of ``names`` (default: all), from the specs (no tensor is generated)."""
        return sum(spec_bytes(self.specs[n]) for n in (self.specs if names is None else names))


def is_expert(name: str) -> bool:
    return ".ffn.experts." in name


def spec_bytes(spec: TensorSpec) -> int:
    return math.prod(spec.shape) * torch.empty((), dtype=spec.dtypes[0]).element_size()


def build_weights(cfg: DeepseekV41Config, device: str, seed: int = 0, draft: bool = False) -> SliceWeights:
    return SliceWeights(cfg, device, seed, draft)


# -- bytes and flops -------------------------------------------------------------------------------
def tensor_bytes_read(cfg: DeepseekV41Config, tokens: int) -> dict[str, float]:
    """Native bytes of each target tensor one step of ``tokens`` tokens must read at least.

    Gathered tables count the rows read (capped at the table): ``embed`` one row per token, each
    Engram table ``(N-1)*n_heads`` rows (+ their UE8M0 scale bytes) per token; a routed expert's
    tensors count times the probability that any of ``tokens*top_k`` uniform picks hits it (so
    the layer's experts add up to ``expected_distinct`` experts); everything else once (attention,
    compressor, indexer, shared expert, router, mHC, Engram ``wkv`` and gate vectors, norms,
    head). The DSpark ``mtp.*`` weights are not read by the target step.
    """
    E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    hit = expected_distinct(tokens, E, k) / E
    out: dict[str, float] = {}
    for name, spec in expected_tensors(cfg).items():
        nb = spec_bytes(spec)
        if name == "embed.weight":
            out[name] = min(tokens, spec.shape[0]) * nb / spec.shape[0]
        elif spec.role in ("engram_table", "engram_scale"):
            out[name] = min(tokens * cfg.engram_n_cols, spec.shape[0]) * nb / spec.shape[0]
        elif is_expert(name):
            out[name] = hit * nb
        else:
            out[name] = float(nb)
    return out


def weight_bytes(w, cfg: DeepseekV41Config, tokens: int) -> dict[str, float]:
    """``sweep.py``'s weight columns: dense (incl. gathered embed/Engram rows), experts, distinct experts."""
    per = tensor_bytes_read(cfg, tokens)
    experts = sum(v for n, v in per.items() if is_expert(n))
    engram = sum(v for n, v in per.items() if ".engram.embed." in n)
    return {"dense": sum(per.values()) - experts, "experts": experts, "engram_rows": engram,
            "distinct_experts": expected_distinct(tokens, cfg.n_routed_experts, cfg.num_experts_per_tok)}


def _index_keys(cfg: DeepseekV41Config, layer: int, vis):
    """Index keys an index source must score: all visible, or for a candidate consumer only the
    keys inside the candidate blocks (our ``index.scores`` scores all and masks afterwards)."""
    if cfg.is_candidate_consumer(layer):
        cap = cfg.candidate_topk_blocks * cfg.candidate_block_size
        return torch.clamp(vis, max=cap) if torch.is_tensor(vis) else min(vis, cap)
    return vis


def kv_bytes(cfg: DeepseekV41Config, batch: int, ctx: int, elt: int = 2) -> float:
    """Cache bytes one decode step (new token at position ``ctx``) reads per request, times ``batch``:
    every layer's window rows; a compressed layer's top-k entries of its kv source's cache; an index
    source's index keys (``_index_keys``); a ratio-2 kv source's ring row (the pair's first token,
    fp32 kv|z); the Engram history ids (int64). Writes (one row per cache) are left out."""
    total = 0.0
    p = ctx
    for i in range(cfg.num_hidden_layers):
        r = cfg.ratio(i)
        total += min(p + 1, cfg.sliding_window) * cfg.head_dim * elt
        if not r:
            continue
        vis = (p + 1) // r
        total += min(vis, cfg.index_topk) * cfg.head_dim * elt
        if cfg.is_index_source(i):
            total += _index_keys(cfg, i, vis) * cfg.index_head_dim * elt
        if cfg.is_kv_source(i) and r == 2:
            total += 2 * cfg.head_dim * 4
    if cfg.engram_layer_ids:
        total += (cfg.engram_max_ngram_size - 1) * 8
    return batch * total


def prefill_flops(w, cfg: DeepseekV41Config, L: int) -> float:
    """Matmul FLOPs of one L-token prefill from position 0 (logits of the last token only).

    Per token: every 2-D target weight that multiplies activations (attention, compressor ``wkv``/
    ``wgate``, indexer ``wq_b``/``weights_proj``, router, shared expert, mHC ``fn``, Engram ``wkv``)
    plus ``top_k`` routed experts; the indexer ``wk`` only on the L/r tokens that close a group.
    Attention: ``4*H*d`` per attended slot (window + top-k entries); indexer: ``2*Hi*Di`` per
    scored key. Embedding / Engram gathers, norms and element-wise ops are not counted.
    """
    specs = expected_tensors(cfg)
    per_tok, closing = 0, 0.0
    for name, spec in specs.items():
        if len(spec.shape) != 2 or spec.role in ("fp8_scale", "mxfp4_scale", "engram_table", "engram_scale",
                                                 "embed") or is_expert(name):
            continue
        n, k = spec.shape
        if name.endswith("indexer.wk.weight"):
            closing += n * k * (L // cfg.ratio(int(name.split(".")[1])))
            continue
        per_tok += n * k
    per_tok += cfg.num_experts_per_tok * 3 * cfg.moe_intermediate_size * cfg.hidden_size * cfg.num_hidden_layers
    fl = 2.0 * L * per_tok + 2.0 * closing + 2.0 * cfg.vocab_size * cfg.hidden_size
    pos = torch.arange(L, dtype=torch.float64)
    for i in range(cfg.num_hidden_layers):
        r = cfg.ratio(i)
        slots = torch.clamp(pos + 1, max=cfg.sliding_window)
        if r:
            vis = torch.div(pos + 1, r, rounding_mode="floor")
            slots = slots + torch.clamp(vis, max=cfg.index_topk)
            if cfg.is_index_source(i):
                fl += 2.0 * cfg.index_n_heads * cfg.index_head_dim * float(_index_keys(cfg, i, vis).sum())
        fl += 4.0 * cfg.num_attention_heads * cfg.head_dim * float(slots.sum())
    return fl


# -- native checkpoint ---------------------------------------------------------------------------
def save_checkpoint(w: SliceWeights, out_dir: str | Path, shard_bytes: int = 4 << 30) -> Path:
    """Write ``w`` (built with ``draft=True`` for the DSpark stages) as a native V4.1 checkpoint:
    nested ``config.json``, safetensors shards + ``model.safetensors.index.json``, the DeepSeek
    tokenizer files. Tensors go to host memory one shard at a time (experts generated on the way),
    so host memory stays near ``shard_bytes``. Refuses when the disk has not room for it."""
    from safetensors.torch import save_file

    from deepinfer_models.deepseek_v4.checkpoint_writer import prepare_checkpoint_dir

    out = prepare_checkpoint_dir(out_dir, w.cfg.to_dict())
    total = w.nbytes()
    free = shutil.disk_usage(out).free
    if total > free:
        raise SystemExit(f"--save-checkpoint {out}: {total / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free")
    plan: list[list[str]] = [[]]
    size = 0
    for name in w.specs:  # greedy in layout order; a weight and its scale stay in one shard
        nb = spec_bytes(w.specs[name])
        if plan[-1] and size + nb > shard_bytes and not name.endswith(".scale"):
            plan.append([])
            size = 0
        plan[-1].append(name)
        size += nb
    weight_map: dict[str, str] = {}
    for i, names in enumerate(plan):
        fname = SINGLE_FILE if len(plan) == 1 else f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors"
        shard = {n: w[n].contiguous().cpu() for n in names}
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in names})
        del shard
    if len(plan) > 1:
        (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                 indent=2) + "\n")
    src = tokenizer_dir()
    for f in TOKENIZER_FILES:
        shutil.copyfile(src / f, out / f)
    return out


__all__ = ["v41_slice", "v41_topology", "describe", "token_map", "SliceWeights", "build_weights",
           "tensor_bytes_read", "weight_bytes", "kv_bytes", "prefill_flops", "save_checkpoint"]
