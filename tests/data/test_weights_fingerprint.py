"""A model's weight fingerprint without weight files samples its tensors; a tensor of more than
2**24 values (any 8B target's embedding) is sampled inside its bounds and the sample moves with
its values."""

from __future__ import annotations

import torch

from draftsmith.data.identity import weights_sha256


def test_a_tensor_beyond_float32_integers_is_fingerprinted():
    big = torch.nn.Embedding(128_256, 512)  # 65,667,072 values: float32 positions round past it
    torch.nn.init.zeros_(big.weight)
    first = weights_sha256(big)
    with torch.no_grad():
        big.weight.view(-1)[-1] = 1.0  # the last value is one of the samples
    assert weights_sha256(big) != first
