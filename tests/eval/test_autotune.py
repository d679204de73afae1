"""Tree budget auto-tuning on a tiny target: measured costs, expected tau, a choice among sizes."""

from draftsmith.decoding.proposers.draft_model import DraftModelTreeProposer
from draftsmith.decoding.proposers.prompt_lookup import PromptLookupProposer
from draftsmith.decoding.proposers.tree_expansion import DynamicTreeConfig
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.decoding.sampling import SamplingConfig
from draftsmith.eval.autotune import autotune_tree, measure_verify_cost
from tests.helpers.tiny_targets import tiny_target


def test_verify_cost_is_measured_for_each_size():
    runner = CausalLMRunner(tiny_target("llama"))
    costs = measure_verify_cost(runner, [1, 4, 16], context_len=32, repeats=2)
    assert set(costs) == {1, 4, 16} and all(c > 0 for c in costs.values())
    assert runner.pending == 0 and runner.length == 32


def test_autotune_picks_depth_and_size_and_expected_tau_grows_with_both():
    target = tiny_target("qwen2")
    sizes, depths = (2, 4, 8), (1, 2, 4)
    budget = autotune_tree(
        CausalLMRunner(target),
        lambda depth, total: DraftModelTreeProposer(target, dynamic=DynamicTreeConfig(2, depth,
                                                                                     total)),
        [list(range(5, 25))], sizes=sizes, depths=depths, max_new_tokens=8)
    assert budget.total_tokens in sizes and budget.depth in depths
    for d in depths:
        taus = [budget.expected_tau[f"{d},{n}"] for n in sizes]
        assert taus == sorted(taus) and taus[0] > 1.0
    for n in sizes:
        taus = [budget.expected_tau[f"{d},{n}"] for d in depths]
        assert taus == sorted(taus)
    assert budget.expected_tau["1,8"] <= 1 + 2, "depth 1 holds at most topk=2 nodes"
    # greedy, the target drafting for itself: its best first token is the one accepted (but for a
    # near-tie that the tree's forward breaks the other way)
    assert budget.expected_tau["1,2"] >= 1.75
    best = max(budget.expected_tokens_per_second, key=budget.expected_tokens_per_second.get)
    assert best == f"{budget.depth},{budget.total_tokens}"
    assert budget.draft_seconds_per_depth > 0


def test_greedy_expected_tau_counts_the_accepted_path_a_smaller_tree_holds():
    """Greedy: the tokens a tree of depth d and n tokens would have accepted are the accepted
    path's nodes among its n best at depth <= d, up to the first it lacks; sampling weighs the
    path probabilities instead."""
    from draftsmith.eval.autotune import _ScoreRecorder

    recorder = _ScoreRecorder(PromptLookupProposer(4, 2))
    # node (probability, depth, index): 1 and 2 at depth 1, 3 under 1 and 4 under 2 at depth 2
    recorder.steps = [[(0.9, 1, 1), (0.5, 2, 3), (0.3, 1, 2), (0.2, 2, 4)],
                      [(0.6, 1, 2), (0.4, 1, 1), (0.3, 2, 4), (0.1, 2, 3)]]
    recorder.accepted = [[1, 3], []]  # the second step accepted nothing
    assert recorder.expected_tau(1, 1, greedy=True) == 1 + (1 + 0) / 2
    assert recorder.expected_tau(2, 2, greedy=True) == 1 + (2 + 0) / 2
    assert recorder.expected_tau(2, 1, greedy=True) == 1 + (1 + 0) / 2
    recorder.accepted = [[1, 3], [1]]  # node 1 is the second step's second best
    assert recorder.expected_tau(2, 1, greedy=True) == 1 + (1 + 0) / 2
    assert recorder.expected_tau(1, 2, greedy=True) == 1 + (1 + 1) / 2
    assert recorder.expected_tau(2, 2, greedy=False) == 1 + (1.4 + 1.0) / 2


def test_tied_nodes_rank_as_the_tree_ranks_them_the_earlier_first():
    import torch

    from draftsmith.decoding.tree import Tree
    from draftsmith.eval.autotune import _ScoreRecorder

    class Fixed(PromptLookupProposer):
        def propose(self, root, max_depth):
            return Tree(torch.tensor([root, 7, 8, 9]), torch.tensor([-1, 0, 0, 1]),
                        torch.tensor([0, 1, 1, 2]), scores=torch.tensor([0.0, -1.0, -0.5, -1.0]))

    recorder = _ScoreRecorder(Fixed(4, 2))
    recorder.propose(0, 3)
    assert [index for _, _, index in recorder.steps[0]] == [2, 1, 3]


def test_a_greedy_hybrid_keeps_each_drafted_step_with_its_accepted_path():
    """Prompt lookup's steps (no scores) are left out of the drafter's record, on both sides."""
    from draftsmith.decoding.decode import generate
    from draftsmith.decoding.proposers.base import TreeSettings
    from draftsmith.decoding.proposers.block_drafter import BlockDrafterProposer
    from draftsmith.decoding.proposers.hybrid import LookupHybridProposer
    from draftsmith.eval.autotune import _ScoreRecorder

    target = tiny_target("llama")
    block = BlockDrafterProposer(tiny_dflash(target, block_size=4),
                                 TreeSettings("chain", block_length=3), "chain")
    recorder = _ScoreRecorder(LookupHybridProposer(block, PromptLookupProposer(8, 2), 2, "h"))
    prompt = [5, 6, 7, 8, 9] * 6
    result = generate(CausalLMRunner(target, output_hidden_states=True), recorder, prompt, 24)
    assert 0 < len(recorder.steps) < len(result.accepted_per_step)  # both kinds of step
    assert len(recorder.accepted) == len(recorder.steps)
    assert recorder.expected_tau(3, 3, greedy=True) >= 1.0


def test_budgets_beyond_a_trees_capacity_are_priced_at_its_capacity():
    from draftsmith.eval.autotune import tree_capacity

    assert [tree_capacity(d, 3) for d in (1, 2, 3)] == [3, 12, 21]
    target = tiny_target("llama")
    budget = autotune_tree(
        CausalLMRunner(target),
        lambda depth, total: DraftModelTreeProposer(target, dynamic=DynamicTreeConfig(2, depth,
                                                                                     total)),
        [list(range(5, 25))], sizes=(4, 8), depths=(1,), max_new_tokens=8, topk=2)
    assert budget.depth == 1 and budget.total_tokens == 2  # depth 1 of top-2 holds 2 nodes
    assert budget.expected_tau["1,8"] == budget.expected_tau["1,2"]
    assert set(budget.verify_seconds) == {1, 3}  # only the sizes that can occur were timed


def test_a_block_drafter_is_tuned_by_length_at_one_forward_per_step():

    from draftsmith.decoding.proposers.base import TreeSettings
    from draftsmith.decoding.proposers.block_drafter import BlockDrafterProposer

    target = tiny_target("llama")
    module = tiny_dflash(target, block_size=5)
    made = []

    def make(depth, total):
        made.append(BlockDrafterProposer(module, TreeSettings("chain", block_length=depth),
                                         "dflash_chain"))
        return made[-1]

    depths = (1, 2, 3, 4)
    # sampled: a random drafter's tokens are never the target's greedy choice, but its path
    # probabilities are its expected acceptance (greedy counts what was accepted: tested above)
    budget = autotune_tree(CausalLMRunner(target, output_hidden_states=True), make,
                           [list(range(5, 25))], depths=depths, max_new_tokens=8,
                           draft_per_step=True, chain=True, sampling=SamplingConfig(1.0))
    assert made[0].record_scores  # the chain scored its nodes for the autotuner
    assert set(budget.expected_tau) == {f"{d},{d}" for d in depths}  # a chain's size is its length
    taus = [budget.expected_tau[f"{d},{d}"] for d in depths]
    assert taus == sorted(taus) and taus[0] > 1.0
    assert budget.total_tokens == budget.depth
    for d in depths:  # one drafter forward per step, whatever the length
        expected = taus[d - 1] / (budget.verify_seconds[d + 1] + budget.draft_seconds_per_step)
        assert abs(budget.expected_tokens_per_second[f"{d},{d}"] - expected) < 1e-9 * expected


def test_a_hybrid_of_a_block_drafter_scores_its_drafted_chains():

    from draftsmith.decoding.proposers.base import TreeSettings
    from draftsmith.decoding.proposers.block_drafter import BlockDrafterProposer
    from draftsmith.decoding.proposers.hybrid import LookupHybridProposer
    from draftsmith.decoding.proposers.prompt_lookup import PromptLookupProposer

    target = tiny_target("llama")
    module = tiny_dflash(target, block_size=4)

    def make(depth, total):
        block = BlockDrafterProposer(module, TreeSettings("chain", block_length=depth), "chain")
        return LookupHybridProposer(block, PromptLookupProposer(8, 3), 3, "chain+lookup")

    budget = autotune_tree(CausalLMRunner(target, output_hidden_states=True), make,
                           [list(range(5, 25))], depths=(1, 2, 3), max_new_tokens=8,
                           draft_per_step=True, chain=True, sampling=SamplingConfig(1.0))
    assert budget.depth in (1, 2, 3) and budget.expected_tau[f"{budget.depth},{budget.depth}"] > 1


def tiny_dflash(target, block_size: int):
    """A random one-layer DFlash drafter for `target`."""
    import torch

    from draftsmith.registry import get_spec

    spec = get_spec("dflash")
    torch.manual_seed(0)
    module = spec.build(target.config, spec.make_config({"block_size": block_size,
                                                         "num_layers": 1}))
    module.init_from_target(target)
    return module
