"""`train.optimizer: muon`: Muon takes the drafter's matrix weights and AdamW the rest, both step
every drafter parameter in a 2-step run of every kind, and a killed Muon run resumes exactly."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.errors import DraftsmithError
from draftsmith.registry import get_spec
from draftsmith.train.loop import run_training
from draftsmith.train.optimizers import MuonWithAdamW, build_optimizer, takes_muon
from draftsmith.train.recipe import TrainSection, build_recipe
from tests.helpers.drafters import small_settings, training_cases, training_vocab
from tests.helpers.state import killed_at_step, reset_accelerate
from tests.helpers.tiny_targets import tiny_target
from tests.train.test_loop import examples, recipe_for

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def _eagle3(**settings):
    spec = get_spec("eagle3")
    target = tiny_target("llama")
    drafter = spec.build(target.config, spec.make_config({**small_settings("eagle3"), **settings}))
    drafter.init_from_target(target)
    return drafter


def test_muon_takes_the_matrices_and_adamw_the_rest():
    drafter = _eagle3(fc_norm=True)
    optimizer = build_optimizer(drafter, TrainSection(optimizer="muon", lr=1e-4))
    assert isinstance(optimizer, MuonWithAdamW)
    names = {id(p): n for n, p in drafter.named_parameters()}
    muon = {names[id(p)] for g in optimizer.muon.param_groups for p in g["params"]}
    adamw = {names[id(p)] for g in optimizer.adamw.param_groups for p in g["params"]}
    assert muon == {"fc.weight", *(f"midlayer.self_attn.{x}_proj.weight" for x in "qkvo"),
                    *(f"midlayer.mlp.{x}_proj.weight" for x in ("gate", "up", "down"))}
    assert "lm_head.weight" in adamw and "fc_norm.0.weight" in adamw and "norm.weight" in adamw
    assert "embed_tokens.weight" not in muon | adamw  # frozen
    assert {g["lr"] for g in optimizer.muon.param_groups} == {1e-3}  # 10 x lr by default
    assert not takes_muon("heads.0.0.linear.weight", torch.nn.Parameter(torch.ones(1, 8)))
    assert build_optimizer(drafter, TrainSection(optimizer="muon", lr=1e-4, muon_lr=0.02)
                           ).muon.param_groups[0]["lr"] == 0.02


def test_the_combined_state_round_trips_and_steps_the_same():
    torch.manual_seed(0)
    drafters = [_eagle3(), _eagle3()]
    drafters[1].load_state_dict(drafters[0].state_dict())
    optimizers = [build_optimizer(d, TrainSection(optimizer="muon", lr=1e-3)) for d in drafters]

    def step(drafter, optimizer, seed):
        gen = torch.Generator().manual_seed(seed)
        for p in drafter.parameters():
            if p.requires_grad:
                p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()

    step(drafters[0], optimizers[0], 1)
    step(drafters[1], optimizers[1], 1)
    optimizers[1].load_state_dict(copy.deepcopy(optimizers[0].state_dict()))
    assert optimizers[1].muon.param_groups[0] is optimizers[1].param_groups[0]
    assert optimizers[1].adamw.state is optimizers[1].state
    step(drafters[0], optimizers[0], 2)
    step(drafters[1], optimizers[1], 2)
    for (name, a), b in zip(drafters[0].state_dict().items(), drafters[1].state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name


def test_bad_optimizer_settings_are_refused():
    with pytest.raises(DraftsmithError, match=r"train\.optimizer='sgd': use one of adamw, muon"):
        build_recipe({"drafter": {"kind": "eagle3"}, "train": {"optimizer": "sgd"}})
    with pytest.raises(DraftsmithError, match=r"train\.muon_lr=0"):
        build_recipe({"drafter": {"kind": "eagle3"}, "train": {"muon_lr": 0}})
    with pytest.raises(DraftsmithError, match="FSDP shards across processes; launch with DDP"):
        build_optimizer(_eagle3(), TrainSection(optimizer="muon"), sharded=True)


@pytest.mark.parametrize("kind, settings", training_cases())
def test_two_muon_steps_move_every_drafter_parameter(kind, settings, tmp_path):
    from accelerate.utils import set_seed

    target = tiny_target("llama")
    recipe = recipe_for(kind, tmp_path, settings, max_steps=2, optimizer="muon")
    vocab = training_vocab(kind, settings, target, examples())
    out = run_training(recipe, examples(), target=target, draft_vocab=vocab)
    weights = load_file(out / "model.safetensors")
    set_seed(recipe.train.seed)  # the drafter the loop started from
    start = get_spec(kind).build(target.config, recipe.drafter_config)
    if vocab is not None:
        start.set_draft_vocab(vocab.d2t, vocab.t2d)
    start.init_from_target(target)
    for name, param in start.named_parameters():
        moved = not torch.equal(weights[name], param.detach())
        assert moved == param.requires_grad, f"{name}: trainable={param.requires_grad}, moved={moved}"
        assert torch.isfinite(weights[name].float()).all(), name


def test_a_killed_muon_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    target = tiny_target("llama")
    data = examples()
    settings = {**small_settings("eagle3"), "draft_vocab_size": 128, "fc_norm": True,
                "norm_output": True}
    train = {"max_steps": 6, "optimizer": "muon"}
    straight = run_training(recipe_for("eagle3", tmp_path / "a", settings, **train), data,
                            target=target)
    reset_accelerate()
    recipe = recipe_for("eagle3", tmp_path / "b", settings, save_every=3, **train)
    killed_at_step(monkeypatch, 5, run_training, recipe, data, target=target)
    resumed = run_training(recipe, data, target=target)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_a_checkpoint_written_before_a_setting_existed_resumes_as_it_ran(tmp_path):
    from draftsmith.train.resume import check_same_run

    def record(**train):
        settings = {"drafter.kind": "eagle3", "train.lr": 1e-3, **train}
        return {"settings": settings, "target": {"name": "t", "config_sha256": "a",
                                                 "weights_sha256": "b"},
                "data": {"examples": 3, "sha256": "c"}, "num_processes": 1}

    old = {"run": record()}  # no train.optimizer / train.muon_lr: written before they existed
    check_same_run(tmp_path, old, record(**{"train.optimizer": "adamw", "train.muon_lr": None}))
    with pytest.raises(DraftsmithError, match=r"train\.optimizer=muon here but adamw in that run"):
        check_same_run(tmp_path, old, record(**{"train.optimizer": "muon",
                                                "train.muon_lr": None}))
    # written before token batches: it batched rows, so today's default would reorder its data
    with pytest.raises(DraftsmithError, match=r"train\.batching=tokens here but rows in that run"
                       r".*set train\.batching=rows to resume it"):
        check_same_run(tmp_path, old, record(**{"train.batching": "tokens"}))
    check_same_run(tmp_path, old, record(**{"train.batching": "rows"}))
