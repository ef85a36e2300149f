from __future__ import annotations

import pytest
import torch


from deepinfer_models.testing import write_tiny_v4_checkpoint


@pytest.fixture(scope="session")
def tiny_v4_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine_v4")
    write_tiny_v4_checkpoint(d, quant="fp8", seed=5)
    return d


def random_prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 129000, (n,), generator=g).tolist()
