"""The tree autotuner's search space per method: a drafter that drafts every depth in one forward
(P-EAGLE, DFlash) is priced at one forward per step at every depth it proposes; one that drafts a
depth per forward (EAGLE-3) is priced per depth; a block drafter's chain is tuned by length."""

from draftsmith.drafter_folder import LoadedDrafter
from draftsmith.eval.method_shapes import search_space
from tests.helpers.drafters import small_settings
from tests.helpers.export_helpers import build_drafter
from tests.helpers.tiny_targets import tiny_target


def _drafters(target, *kinds):
    return {kind: (LoadedDrafter(kind, build_drafter(kind, target, small_settings(kind)), {}),
                   target) for kind in kinds}


def test_one_forward_drafters_are_priced_per_step_at_each_depth_they_propose():
    target = tiny_target("llama")
    drafters = _drafters(target, "peagle", "eagle3", "dflash")
    peagle = drafters["peagle"][0].module
    assert search_space("drafter_dynamic@peagle", drafters, 3) == {
        "topk": 3, "depths": tuple(range(1, peagle.proposals + 1)), "draft_per_step": True}
    assert search_space("drafter_dynamic@eagle3", drafters, 3) == {"topk": 3}
    dflash = drafters["dflash"][0].module
    chain = search_space("drafter_chain@dflash", drafters, 3)
    assert chain == {"topk": None, "depths": tuple(range(1, dflash.proposals + 1)),
                     "draft_per_step": True, "chain": True}
    assert search_space("drafter_dynamic@dflash", drafters, 3)["chain"] is False
