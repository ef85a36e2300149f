"""Speculative decoding in the core: configuration, the proposer contract, lossless
verification, confidence-scheduled verification budgets and metrics.

The flow (docs/speculative_decoding.md): the runner verifies the drafts a request carries
(``verify``), then asks the model's proposer for the next drafts; the scheduler feeds
``[anchor, d_1..d_L]`` next step, with ``L`` chosen by ``confidence.ConfidenceScheduler``.
"""
