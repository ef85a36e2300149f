"""DeepSeek-V4.1(-Flash) text model: config, checkpoint layout, paged model, loader, tiny writer.

V4.1 is a delta over V4 (MODEL_SPEC.md section 3; decisions in docs/models/deepseek_v41_implementation.md section 8):
compress ratios 0/1/2 with compressors only on kv-source layers and indexers only on
index-source layers (keys from the kv source's latent), a two-level candidate-block filter,
no per-head q norm, delayed mHC with a final collapse instead of ``hc_head``, no hash
routing, and Engram n-gram memories on a few layers. The MoE and the linear layers are
V4's (reused from ``deepinfer_models.deepseek_v4``).
"""
