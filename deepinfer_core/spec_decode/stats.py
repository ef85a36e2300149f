"""Speculative-decoding metrics (vLLM's names where it has them)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    """Counters since engine start.

    num_drafts: verify events (a request verifying >= 0 drafts after a draft step);
    num_draft_tokens: drafts proposed; num_verified_tokens: drafts fed to the target (after
    confidence scheduling); num_accepted_tokens: drafts accepted; accepted_per_position[k]:
    how often draft k+1 was accepted; verified_per_position[k]: how often it was verified.
    """

    num_speculative_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_verified_tokens: int = 0
    num_accepted_tokens: int = 0
    num_target_steps: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    verified_per_position: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.num_speculative_tokens
        self.accepted_per_position = self.accepted_per_position or [0] * n
        self.verified_per_position = self.verified_per_position or [0] * n

    def observe(self, proposed: int, verified: int, accepted: int) -> None:
        if not 0 <= accepted <= verified <= proposed <= self.num_speculative_tokens:
            raise ValueError(f"inconsistent spec step: proposed {proposed}, verified {verified}, accepted {accepted}")
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_verified_tokens += verified
        self.num_accepted_tokens += accepted
        for k in range(verified):
            self.verified_per_position[k] += 1
        for k in range(accepted):
            self.accepted_per_position[k] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify event (accepted drafts + the one target token)."""
        return (self.num_accepted_tokens + self.num_drafts) / self.num_drafts if self.num_drafts else 0.0

    def as_dict(self) -> dict:
        d = self.num_drafts
        return {
            "num_drafts": d, "num_draft_tokens": self.num_draft_tokens,
            "num_verified_tokens": self.num_verified_tokens, "num_accepted_tokens": self.num_accepted_tokens,
            "num_target_steps": self.num_target_steps,
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_rate": self.num_accepted_tokens / self.num_verified_tokens if self.num_verified_tokens else 0.0,
            "verified_per_draft_step": self.num_verified_tokens / d if d else 0.0,
            "accepted_per_position": list(self.accepted_per_position),
            "verified_per_position": list(self.verified_per_position),
        }
