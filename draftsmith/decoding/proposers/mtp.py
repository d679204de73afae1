"""Chain drafting with MTP modules: module k proposes the k-th token after the root.

Each module keeps its own KV cache. Module k's entry at position i reads token t_{i+k+1} and the
previous module's output at i, so an entry is committed only once that token is verified; entries
that used draft tokens are recomputed at the next step. Outputs of committed entries are kept for
as long as the next module still needs them.
"""

from __future__ import annotations

import torch

from draftsmith.decoding.proposers.base import Proposer, TreeSettings, register_family
from draftsmith.decoding.runner import ForwardOutput
from draftsmith.decoding.tree import Tree, chain_tree
from draftsmith.models.contracts import ModuleChainDrafterModule


class MTPProposer:
    """Chain of up to K drafts from a trained MTPDrafter (greedy top-1 per module)."""

    name = "mtp_chain"
    needs_hidden_states = False

    def __init__(self, drafter: ModuleChainDrafterModule, name: str = "mtp_chain"):
        self.drafter = drafter
        self.name = name
        self.num_modules = len(drafter.layers)

    def reset(self, context: list[int], target_out: ForwardOutput) -> None:
        self.tokens = list(context)
        self.features = {i: target_out.last_hidden[i] for i in range(len(context))}
        self.committed = [0] * self.num_modules
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.num_modules
        self.outputs: list[dict[int, torch.Tensor]] = [{} for _ in range(self.num_modules)]

    @torch.inference_mode()
    def propose(self, root: int, max_depth: int) -> Tree:
        self.tokens.append(root)
        last = len(self.tokens) - 1  # the root's position R; entries run up to R - 1
        device = next(self.drafter.parameters()).device
        drafts: list[int] = []
        inputs = self.features  # h^0 = target features
        for k in range(min(self.num_modules, max_depth)):
            start = self.committed[k]
            positions = list(range(start, last))
            if not positions:
                break
            tokens = [self.tokens[i + k + 1] if i + k + 1 <= last else drafts[i + k - last]
                      for i in positions]
            hidden = torch.stack([inputs[i] for i in positions])[None]
            n = len(positions)
            mask = torch.cat([torch.ones(n, start, dtype=torch.bool, device=device),
                              torch.ones(n, n, dtype=torch.bool, device=device).tril()],
                             dim=1)[None, None]
            out, logits, (keys, values) = self.drafter.module_step(
                k, torch.tensor([tokens], device=device), hidden,
                torch.tensor([positions], device=device), mask, self.kv[k])
            drafts.append(int(logits[0, -1].argmax()))
            # commit entries whose token was verified: i + k + 1 <= R
            keep = max(0, min(n, last - k - start))
            if keep:
                new_k, new_v = keys[:, :, :keep], values[:, :, :keep]
                old = self.kv[k]
                self.kv[k] = (new_k, new_v) if old is None else (
                    torch.cat([old[0], new_k], 2), torch.cat([old[1], new_v], 2))
                for row in range(keep):
                    self.outputs[k][positions[row]] = out[0, row]
                self.committed[k] = start + keep
            step_outputs = {i: out[0, row] for row, i in enumerate(positions)}
            inputs = {**self.outputs[k], **step_outputs}
        self._prune()
        return chain_tree(root, drafts, device=device)

    def _prune(self) -> None:
        for i in [i for i in self.features if i < self.committed[0]]:
            del self.features[i]
        for k in range(self.num_modules - 1):
            for i in [i for i in self.outputs[k] if i < self.committed[k + 1]]:
                del self.outputs[k][i]
        self.outputs[-1].clear()

    def skip(self, root: int) -> None:
        """This step's tree came from elsewhere: the root takes its position, and its entries
        are fed with the next proposal's."""
        self.tokens.append(root)

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        root_position = len(self.tokens) - 1
        for offset, node in enumerate(path):
            self.features[root_position + offset] = target_out.last_hidden[node]
        self.tokens.extend(path_tokens[1:])


@register_family("modules")
def modules_family(module: ModuleChainDrafterModule, tree: TreeSettings, name: str) -> Proposer:
    """Chained multi-token-prediction modules (MTP): one chain, a draft per module."""
    return MTPProposer(module, name)
