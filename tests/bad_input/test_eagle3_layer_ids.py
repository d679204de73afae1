"""EAGLE-3 aux layer ids are checked against the target when the drafter is built (issue #18)."""

from __future__ import annotations

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.models.eagle3 import Eagle3Config, Eagle3Drafter, eagle3_layer_ids
from tests.helpers.tiny_targets import tiny_config


def test_layer_ids_are_validated_when_the_drafter_is_built():
    config = tiny_config("llama")  # 4 layers
    assert Eagle3Drafter(config, Eagle3Config(draft_vocab_size=100)).layer_ids == [0, 1, 3]
    for ids in ([1, 1, 0], [0, 1, 4], [0, 1], [-1, 1, 2]):
        with pytest.raises(DraftsmithError, match=r"drafter.layer_ids.*strictly increasing.*"
                                                  r"in 0\.\.3 .*num_hidden_layers=4"):
            Eagle3Drafter(config, Eagle3Config(draft_vocab_size=100, layer_ids=ids))
    assert eagle3_layer_ids(30) == [1, 14, 26]  # the reference default for real targets
    assert eagle3_layer_ids(8) == [1, 3, 4]
    assert eagle3_layer_ids(3) == [0, 1, 2]
    for shallow in (1, 2):
        with pytest.raises(DraftsmithError, match=rf"three distinct .*num_hidden_layers={shallow}"):
            eagle3_layer_ids(shallow)
        with pytest.raises(DraftsmithError, match="three distinct"):
            Eagle3Drafter(tiny_config("llama", num_hidden_layers=shallow), Eagle3Config())
