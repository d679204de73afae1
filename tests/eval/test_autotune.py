"""Tree budget auto-tuning on a tiny target: measured costs, expected tau, a choice among sizes."""

from draftsmith.eval.autotune import autotune_total_tokens, measure_verify_cost
from draftsmith.eval.proposers.draft_model import DraftModelTreeProposer
from draftsmith.eval.proposers.tree_expansion import DynamicTreeConfig
from draftsmith.eval.runner import CausalLMRunner

from tiny_targets import tiny_target


def test_verify_cost_is_measured_for_each_size():
    runner = CausalLMRunner(tiny_target("llama"))
    costs = measure_verify_cost(runner, [1, 4, 16], context_len=32, repeats=2)
    assert set(costs) == {1, 4, 16} and all(c > 0 for c in costs.values())
    assert runner.pending == 0 and runner.length == 32


def test_autotune_picks_a_size_and_expected_tau_grows_with_it():
    target = tiny_target("qwen2")
    sizes = (2, 4, 8)
    budget = autotune_total_tokens(
        CausalLMRunner(target),
        lambda total: DraftModelTreeProposer(target, dynamic=DynamicTreeConfig(2, 4, total)),
        [list(range(5, 25))], sizes=sizes, max_new_tokens=8)
    assert budget.total_tokens in sizes
    taus = [budget.expected_tau[n] for n in sizes]
    assert taus == sorted(taus) and taus[0] > 1.0
    best = max(sizes, key=lambda n: budget.expected_tokens_per_second[n])
    assert budget.total_tokens == best
