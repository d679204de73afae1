"""A new drafter kind with a new decoding family is its own module, one registry entry and one
format entry: a toy kind defined here, decoded by a toy family that is not one of the package's
(not `heads`), trains, decodes losslessly, exports and loads back with no other file touched;
with a `--spec-type` in its spec and a `gguf_stage` in its format entry it also exports as a
llama.cpp draft GGUF, no GGUF module naming it."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers.base import FAMILIES, TreeSettings
from draftsmith.decoding.runner import CausalLMRunner, ForwardOutput
from draftsmith.decoding.tree import Tree, chain_tree, root_only_tree
from draftsmith.eval.methods import make_drafter_proposer
from draftsmith.eval.settings import DecodeSettings
from draftsmith.export import export_drafter, load_any_drafter
from draftsmith.export.formats import FORMATS
from draftsmith.export.record import ExportedDrafter, ExportFormat
from draftsmith.export.weights import read_json
from draftsmith.models.layers import shift_left
from draftsmith.registry import DRAFTERS, DrafterSpec
from draftsmith.train.loop import run_training
from draftsmith.train.recipe import build_recipe
from tests.decoding.test_decode import _prompt, _reference
from tests.helpers.export_helpers import write_checkpoint
from tests.helpers.tiny_targets import tiny_target

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@dataclass
class ToyConfig:
    """One linear head per draft position on the last hidden state."""

    num_heads: int = 2


class ToyHeads(nn.Module):
    kind = "toy"

    def __init__(self, target_config, config: ToyConfig):
        super().__init__()
        self.config = config
        self.heads = nn.ModuleList(nn.Linear(target_config.hidden_size, target_config.vocab_size,
                                             bias=False) for _ in range(config.num_heads))

    def init_from_target(self, target: nn.Module) -> None:
        for head in self.heads:
            head.weight.data.copy_(target.get_output_embeddings().weight.data)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (K, ..., V)
        return torch.stack([head(hidden.to(head.weight.dtype)) for head in self.heads])


class ToyChainProposer:
    """The toy family: head k on the last accepted hidden state drafts token k+1 after the root,
    all heads at once, as one chain."""

    needs_hidden_states = False

    def __init__(self, module: ToyHeads, name: str):
        self.module, self.name, self.hidden = module, name, None

    def reset(self, context: list[int], target_out: ForwardOutput) -> None:
        self.hidden = target_out.last_hidden[-1] if context else None

    def propose(self, root: int, max_depth: int) -> Tree:
        device = next(self.module.parameters()).device
        if self.hidden is None or max_depth < 1:
            return root_only_tree(root, device)
        drafts = self.module(self.hidden).argmax(-1)[:max_depth].tolist()
        return chain_tree(root, drafts, device=device)

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        self.hidden = target_out.last_hidden[path[-1]]


def toy_family(module: ToyHeads, tree: TreeSettings, name: str) -> ToyChainProposer:
    return ToyChainProposer(module, name)


def toy_loss(module: ToyHeads, features):
    """Head k at position t learns the target's distribution of token t+2+k (soft CE)."""
    t = features.input_ids.shape[1]
    index = torch.arange(t)[None]
    total, metrics = features.last_hidden.new_zeros(()), {}
    for k, head in enumerate(module.heads):
        valid = (shift_left(features.loss_mask, 2 + k) > 0) & (index < t - 2 - k)
        teacher = features.logits_after(valid, 1 + k).float()
        logits = head(features.last_hidden[valid]).float()
        loss = -(teacher.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()
        total = total + loss
        metrics[f"acc_{k}"] = (logits.argmax(-1) == teacher.argmax(-1)).float().mean()
    return total, metrics


def write_toy(ckpt, out: Path, options) -> dict:
    save_file({k: v.contiguous() for k, v in ckpt.tensors.items()}, out / "toy.safetensors")
    return {"toy_heads": ckpt.meta["drafter_config"]["num_heads"],
            "hidden_size": ckpt.target_config.hidden_size,
            "vocab_size": ckpt.target_config.vocab_size}


def read_toy(config: dict, tensors: dict, where: str) -> ExportedDrafter:
    return ExportedDrafter(format="toy", kind="toy", settings={"num_heads": config["toy_heads"]},
                           state=tensors, hidden_size=config["hidden_size"],
                           vocab_size=config["vocab_size"])


@pytest.fixture
def toy_kind(monkeypatch):
    """The toy kind's three entries: its decoding family, its registry spec, its export format."""
    monkeypatch.setitem(FAMILIES, "toy_chain", toy_family)
    spec = DrafterSpec(kind="toy", title="Toy heads", description="a test-only kind",
                       config_cls=ToyConfig, build=ToyHeads, aux_layers=lambda n, cfg: [],
                       loss=toy_loss, proposer="toy_chain", tree_shapes=("chain",))
    monkeypatch.setitem(DRAFTERS, "toy", spec)
    monkeypatch.setitem(FORMATS, "toy", ExportFormat(
        "toy", "toy", "test-only layout", write_toy,
        lambda config, names: "toy_heads" in config, read_toy))
    return spec


def examples(n=24, t=20):
    gen = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(2, 128, (t,), generator=gen).tolist(),
             "loss_mask": [0] * 4 + [1] * (t - 4)} for _ in range(n)]


def test_a_kind_defined_in_a_test_trains_decodes_exports_and_loads_back(toy_kind, tmp_path):
    target = tiny_target("llama")
    recipe = build_recipe({"drafter": {"kind": "toy", "num_heads": 2},
                           "train": {"batch_size": 4, "max_steps": 4, "warmup_steps": 1,
                                     "lr": 1e-2, "output_dir": str(tmp_path / "run"),
                                     "eval_fraction": 0.2, "mixed_precision": "no"}})
    before = ToyHeads(target.config, ToyConfig(2))
    before.init_from_target(target)
    folder = run_training(recipe, examples(), target=target)

    trained = load_file(folder / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in trained.values())
    assert any(not torch.equal(trained[k], v) for k, v in before.state_dict().items())
    meta = json.loads((folder / "draftsmith_drafter.json").read_text())
    assert meta["kind"] == "toy" and meta["training_steps"] == 4

    prompt = _prompt(0)
    reference = _reference(target, prompt)
    runner = CausalLMRunner(target)
    for path in (folder, export_drafter(folder, "toy", tmp_path / "export")):
        loaded = load_any_drafter(path, target)
        assert loaded.kind == "toy"
        for method in ("drafter", "drafter_chain"):
            proposer = make_drafter_proposer(method, loaded, DecodeSettings(num_draft_tokens=2))
            assert isinstance(proposer, ToyChainProposer)
            result = generate(runner, proposer, prompt, 40)
            assert result.tokens == reference
            assert max(result.depth_per_step) == 2, "the toy family drafted its two heads"
        for name, value in trained.items():
            torch.testing.assert_close(loaded.module.state_dict()[name], value, rtol=0, atol=0)


def test_a_shape_the_kind_does_not_decode_with_is_refused(toy_kind):
    target = tiny_target("llama")
    module = ToyHeads(target.config, ToyConfig())
    loaded = type("Loaded", (), {"kind": "toy", "module": module, "meta": {}})()
    with pytest.raises(Exception, match="Toy heads drafters decode with chain trees"):
        make_drafter_proposer("drafter_dynamic", loaded, DecodeSettings())



def stage_toy(config: dict, where: str) -> list[int]:
    """The toy layout as an imagined converter reads it: heads under its own key, layer 1."""
    config["llama_cpp_heads"] = config.pop("toy_heads")
    return [1]


def test_a_kinds_gguf_export_comes_from_its_spec_and_format_entry_alone(toy_kind, tmp_path,
                                                                       monkeypatch):
    from gguf import GGUFWriter

    from draftsmith.llama_cpp import convert

    monkeypatch.setitem(DRAFTERS, "toy", replace(toy_kind, engine_methods={"llama.cpp": "draft-toy"}))
    monkeypatch.setitem(FORMATS, "toy", replace(FORMATS["toy"], gguf_stage=stage_toy))
    seen = {}

    def converter(script, arguments, outtype, partial, what):
        """llama.cpp's converter, played: it records the staged config, writes the layers."""
        seen["config"] = read_json(Path(arguments[0]) / "config.json")
        writer = GGUFWriter(partial, "toy")
        writer.add_array("toy.target_layers", [1])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    monkeypatch.setattr(convert, "converter_script", lambda log: Path("convert_hf_to_gguf.py"))
    monkeypatch.setattr(convert, "_run_converter", converter)
    target = tiny_target("llama")
    module = ToyHeads(target.config, ToyConfig(2))
    folder = write_checkpoint(tmp_path / "drafter", "toy", module, target, {"num_heads": 2})
    target.config.save_pretrained(tmp_path / "target")
    out = export_drafter(folder, "gguf", tmp_path / "gguf", target_dir=tmp_path / "target")

    assert seen["config"]["llama_cpp_heads"] == 2 and "toy_heads" not in seen["config"]
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "draft-toy.gguf",
                                                     "draftsmith_drafter.json"]
    assert "--spec-type draft-toy" in (out / "README.md").read_text()
