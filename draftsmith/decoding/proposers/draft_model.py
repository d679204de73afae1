"""Classic speculative decoding: a smaller causal LM with the target's tokenizer drafts a chain.

The draft model keeps its own KV cache in step with the accepted text. Accepted drafts it has not
forwarded yet (the last one of a fully accepted chain) are fed together with the next root, so no
token is ever forwarded twice by the draft.
"""

from __future__ import annotations

import torch

from draftsmith.decoding.proposers.tree_expansion import (
    DynamicTreeConfig,
    TreeSlots,
    grow_dynamic_tree,
    grow_static_tree,
)
from draftsmith.decoding.runner import CausalLMRunner, ForwardOutput
from draftsmith.decoding.sampling import SamplingConfig, logits_to_probs, sample_token
from draftsmith.decoding.tree import Tree, chain_tree, root_only_tree
from draftsmith.errors import DraftsmithError


def check_same_vocab(target: torch.nn.Module, draft: torch.nn.Module) -> None:
    """Raise when the draft's output vocabulary cannot be compared with the target's."""
    vt = target.get_output_embeddings().weight.shape[0]
    vd = draft.get_output_embeddings().weight.shape[0]
    if vt != vd:
        raise DraftsmithError(
            f"draft model vocab ({vd}) differs from the target's ({vt}); a classic draft model "
            "must share the target's tokenizer (e.g. Qwen2.5-Coder-0.5B for Qwen2.5-Coder-1.5B)"
        )


class DraftModelProposer:
    """Chain of `num_tokens` drafts from a small causal LM.

    Args:
        draft_model: causal LM sharing the target's vocabulary.
        num_tokens: chain length k.
        sampling: greedy drafts when temperature is 0, otherwise drafts sampled from the draft's
            distribution under the same temperature / top-p (recorded for verification).
        generator: random source for sampled drafts.
    """

    name = "draft_model"
    needs_hidden_states = False

    def __init__(self, draft_model: torch.nn.Module, num_tokens: int = 4,
                 sampling: SamplingConfig | None = None,
                 generator: torch.Generator | None = None):
        if num_tokens < 1:
            raise ValueError(f"num_tokens={num_tokens} must be >= 1")
        self.runner = CausalLMRunner(draft_model)
        self.num_tokens = num_tokens
        self.sampling = sampling or SamplingConfig()
        self.generator = generator
        self.unfed: list[int] = []

    def reset(self, context: list[int], target_out: ForwardOutput | None = None) -> None:
        self.runner.reset()
        self.unfed = list(context)

    def _choose(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next draft as a (1,) tensor on the logits' device (no host read), and the
        distribution it was drawn from when sampling."""
        if self.sampling.greedy:
            return logits.argmax(-1, keepdim=True), None
        probs = logits_to_probs(logits, self.sampling)
        return sample_token(probs, self.generator), probs

    def propose(self, root: int, max_depth: int) -> Tree:
        device = self.runner.device
        feed = torch.tensor([*self.unfed, root], dtype=torch.long, device=device)
        logits = self.runner.forward(feed, logits_to_keep=1).logits[-1]
        self.runner.commit()
        self.unfed = []
        drafts, probs = [], []
        for step in range(min(self.num_tokens, max_depth)):
            token, q = self._choose(logits)
            drafts.append(token)
            probs.append(q)
            if step + 1 < min(self.num_tokens, max_depth):
                logits = self.runner.forward(token).logits[-1]
        if not drafts:
            return root_only_tree(root, device)
        draft_probs = None if self.sampling.greedy else torch.stack(probs)
        return chain_tree(root, torch.cat(drafts).tolist(), draft_probs, device)

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        accepted = len(path_tokens) - 1
        kept = min(accepted, self.runner.pending)
        self.runner.commit(list(range(kept)))
        self.unfed = path_tokens[1 + kept:]


class DraftModelTreeProposer:
    """A small causal LM grows a static or dynamic (EAGLE-2 style) tree using tree attention.

    Tree nodes are forwarded into the draft's cache with an ancestor mask and dropped after the
    tree is built; accepted tokens are fed with the next root. Candidates are deterministic
    (top-k), so sampling verification treats them as point masses and stays lossless.

    Args:
        draft_model: causal LM sharing the target's vocabulary.
        choices: static tree as top-k rank paths; None selects the dynamic tree.
        dynamic: EAGLE-2 expansion settings when `choices` is None.
    """

    def __init__(self, draft_model: torch.nn.Module,
                 choices: tuple[tuple[int, ...], ...] | None = None,
                 dynamic: DynamicTreeConfig | None = None):
        self.needs_hidden_states = False
        self.runner = CausalLMRunner(draft_model)
        self.choices = choices
        self.dynamic = dynamic or DynamicTreeConfig()
        self.name = "draft_model_static_tree" if choices else "draft_model_dynamic_tree"
        self.unfed: list[int] = []
        self._slots = TreeSlots(self.runner.device)

    def reset(self, context: list[int], target_out: ForwardOutput | None = None) -> None:
        self.runner.reset()
        self.unfed = list(context)

    def _expand(self, tokens: torch.Tensor, ids: list[int], parents: list[int]) -> torch.Tensor:
        mask, depths = self._slots.add(ids, parents)  # the tree nodes are the pending entries
        positions = torch.tensor([self.runner.length - 1 + d for d in depths],
                                 device=self.runner.device)
        out = self.runner.forward(tokens, positions, mask)
        return torch.log_softmax(out.logits.float(), dim=-1)

    def propose(self, root: int, max_depth: int) -> Tree:
        feed = torch.tensor([*self.unfed, root], dtype=torch.long, device=self.runner.device)
        logits = self.runner.forward(feed, logits_to_keep=1).logits[-1]
        self.runner.commit()
        self.unfed = []
        self._slots = TreeSlots(self.runner.device)
        root_logprobs = torch.log_softmax(logits.float(), dim=-1)
        if self.choices:
            tree = grow_static_tree(root, root_logprobs, self._expand, self.choices, max_depth)
        else:
            tree = grow_dynamic_tree(root, root_logprobs, self._expand, self.dynamic, max_depth)
        self.runner.rollback()
        return tree

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        self.unfed = path_tokens[1:]
