"""Resuming training (issue #18): a checkpoint never runs code planted in its files, a resume
never mixes two runs (settings, target, data), what a kill leaves behind (an interrupted save, a
half-written metrics line) never blocks the next run, and old checkpoints are pruned to
`train.keep_checkpoints` only once a newer one is complete."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import draftsmith.train.checkpoint as checkpoint_module
from draftsmith.errors import DraftsmithError
from draftsmith.train.loop import run_training
from draftsmith.train.recipe import build_recipe
from tests.helpers.state import reset_accelerate
from tests.helpers.tiny_targets import tiny_target
from tests.train.test_loop import examples, recipe_for

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

KIND = "eagle1"
STEPS = 8


def train(folder, data=None, target=None, **settings):
    """Run the loop on a tiny Llama with a fresh accelerate state; returns the drafter folder."""
    reset_accelerate()
    recipe = recipe_for(KIND, folder, max_steps=settings.pop("max_steps", STEPS), **settings)
    return run_training(recipe, examples() if data is None else data,
                        target=tiny_target("llama") if target is None else target)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(weights of an uninterrupted run, a run folder as a kill after step 4 leaves it: the
    step_4 checkpoint and metrics rows, no drafter)."""
    root = tmp_path_factory.mktemp("runs")
    straight = load_file(train(root / "straight") / "model.safetensors")
    shutil.rmtree(train(root / "stopped", save_every=4))
    reset_accelerate()
    return straight, root / "stopped" / KIND


@pytest.fixture
def stopped(runs, tmp_path):
    """A private copy of the interrupted run; its recipe is `recipe_for(KIND, tmp_path, ...)`."""
    shutil.copytree(runs[1], tmp_path / KIND)
    return tmp_path / KIND


def loss_steps(run_dir) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if "loss" in row]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def snapshot(run_dir) -> dict:
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file()}


class Payload:
    """Pickles to a call that writes `marker` when unpickled (the attack on a checkpoint)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


# accelerate's pickled file names: the one draftsmith writes and those it would read if present
PLANTED = ["optimizer.bin", "custom_checkpoint_0.pkl", "random_states_0.pkl", "scheduler.bin",
           "scaler.pt", "pytorch_model.bin", "sampler.bin"]


@pytest.mark.parametrize("name", PLANTED)
def test_a_payload_planted_in_a_checkpoint_never_runs(stopped, tmp_path, name):
    folder = stopped / "checkpoints" / "step_4"
    pickled = sorted(p.name for p in folder.iterdir()
                     if not p.name.endswith((".json", ".safetensors")))
    assert pickled == ["optimizer.bin"], "the only torch pickle, read back as tensors only"
    marker = tmp_path / "marker"
    torch.save({"state": Payload(marker)}, folder / name)
    torch.load(folder / name, weights_only=False)  # the payload is live: unpickling runs it
    assert marker.is_file()
    marker.unlink()
    before = snapshot(stopped)

    with pytest.raises(DraftsmithError, match=rf"{name} (holds pickled objects other than tensors"
                                              r"|is not part of a draftsmith checkpoint)") as err:
        train(tmp_path, save_every=4)
    assert "delete" in str(err.value) and str(folder) in str(err.value)
    assert not marker.exists(), "the planted code ran"
    assert snapshot(stopped) == before, "a refused resume changes nothing"


def test_a_raw_pickle_planted_in_a_checkpoint_never_runs(stopped, tmp_path):
    """A plain `pickle.dump` (not torch's zip format) in place of the optimizer state."""
    import pickle

    marker = tmp_path / "marker"
    (stopped / "checkpoints" / "step_4" / "optimizer.bin").write_bytes(
        pickle.dumps(Payload(marker)))
    with pytest.raises(DraftsmithError, match=r"optimizer.bin is damaged or not a torch file"):
        train(tmp_path, save_every=4)
    assert not marker.exists()


@pytest.mark.parametrize("change, phrases", [
    ({"max_steps": 6}, ["train.max_steps=6 here but 8 in that run", "set train.max_steps=8"]),
    ({"max_steps": 12}, ["train.max_steps=12 here but 8 in that run", "schedule is fixed"]),
    ({"lr": 2e-3}, ["train.lr=0.002 here but 0.001 in that run", "set train.lr=0.001"]),
    ({"target": 1}, ["trained against another target", "resume it with the target it started"]),
    ({"data": 1}, ["trained on other data", "the data changed since the run started"]),
], ids=["fewer-steps", "more-steps", "lr", "target", "data"])
def test_resuming_with_another_setting_target_or_data_is_refused(stopped, tmp_path, change,
                                                                 phrases):
    before = snapshot(stopped)
    settings = {k: v for k, v in change.items() if k not in ("target", "data")}
    target = tiny_target("llama", seed=change["target"]) if "target" in change else None
    data = examples(seed=change["data"]) if "data" in change else None
    with pytest.raises(DraftsmithError) as err:
        train(tmp_path, data=data, target=target, save_every=4, **settings)
    for phrase in [*phrases, "start a new run with another train.output_dir"]:
        assert phrase in str(err.value), (phrase, str(err.value))
    assert snapshot(stopped) == before, "metrics, checkpoint and drafter untouched"


def test_resuming_with_other_bookkeeping_settings_gives_the_same_drafter(runs, stopped, tmp_path):
    """save_every, eval_every and keep_checkpoints decide what is written, not what trains; the
    drafter records the settings this run used."""
    out = train(tmp_path, save_every=2, eval_every=3, keep_checkpoints=1)
    assert_same_weights(runs[0], load_file(out / "model.safetensors"))
    meta = json.loads((out / "draftsmith_drafter.json").read_text())
    assert meta["recipe"]["train"]["save_every"] == 2 and meta["training_steps"] == STEPS
    assert loss_steps(stopped) == list(range(1, STEPS + 1))
    assert [p.name for p in (stopped / "checkpoints").iterdir()] == ["step_6"]


def _edit_progress(folder, change):
    path = folder / "progress.json"
    progress = json.loads(path.read_text())
    change(progress)
    path.write_text(json.dumps(progress))


@pytest.mark.parametrize("damage, message", [
    (lambda f: (f / "progress.json").write_text('{"step": 4, "tot'),
     "progress.json is not readable JSON"),
    (lambda f: _edit_progress(f, lambda p: [p.pop("format"), p.pop("run")]),
     "was written by an older draftsmith"),
    (lambda f: _edit_progress(f, lambda p: p.update(step="4")), "malformed fields"),
    (lambda f: _edit_progress(f, lambda p: p["run"].update(num_processes=2)),
     "launch with --num_processes 2 to resume it"),
    (lambda f: _edit_progress(f, lambda p: p["scheduler"].update(last_epoch="x")),
     "its scheduler state"),
    (lambda f: (f / "optimizer.bin").write_bytes((f / "optimizer.bin").read_bytes()[:500]),
     "optimizer.bin is damaged or not a torch file"),
    (lambda f: (f / "model.safetensors").write_bytes(b"\0" * 64), "is damaged"),
    (lambda f: (f / "rng_state_0.safetensors").unlink(), "rng_state_0.safetensors is missing"),
    (lambda f: (f / "pytorch_model_fsdp_0").mkdir() or (f / "pytorch_model_fsdp_0" / ".metadata")
     .write_bytes(b"\x80\x04N."), "is a sharded FSDP checkpoint"),
], ids=["progress-torn", "old-format", "bad-field", "processes", "scheduler", "optimizer",
        "model", "rng", "sharded-fsdp"])
def test_a_damaged_checkpoint_is_one_clear_error(stopped, tmp_path, damage, message):
    folder = stopped / "checkpoints" / "step_4"
    damage(folder)
    with pytest.raises(DraftsmithError) as err:
        train(tmp_path, save_every=4)
    assert message in str(err.value), str(err.value)
    assert f"delete {folder}" in str(err.value) or f"delete {folder.parent}" in str(err.value)


def test_an_interrupted_save_is_removed_and_the_run_resumes_exactly(runs, stopped, tmp_path,
                                                                    capsys):
    """A kill between writing progress.json and the rename leaves step_6.partial looking
    complete: it is not a checkpoint (it used to crash every resume with int('6.partial'))."""
    partial = stopped / "checkpoints" / "step_6.partial"
    shutil.copytree(stopped / "checkpoints" / "step_4", partial)
    _edit_progress(partial, lambda p: p.update(step=6))
    out = train(tmp_path, save_every=4)
    assert "removed 1 interrupted checkpoint save(s): step_6.partial" in capsys.readouterr().out
    assert not partial.exists()
    assert_same_weights(runs[0], load_file(out / "model.safetensors"))
    assert loss_steps(stopped) == list(range(1, STEPS + 1))


def test_a_half_written_last_metrics_line_is_dropped_with_a_note(runs, stopped, tmp_path, capsys):
    with open(stopped / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 9, "loss": 0.9')  # the kill came mid-line
    out = train(tmp_path, save_every=4)
    assert "dropped its half-written last line" in capsys.readouterr().out
    assert loss_steps(stopped) == list(range(1, STEPS + 1)), "one row per step, all parsable"
    assert_same_weights(runs[0], load_file(out / "model.safetensors"))


def test_a_damaged_metrics_line_is_one_clear_error(stopped, tmp_path):
    lines = (stopped / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines.insert(2, "\0\0\0 not json\n")
    (stopped / "metrics.jsonl").write_text("".join(lines))
    with pytest.raises(DraftsmithError, match=r"metrics.jsonl:3 is not a metrics row .*delete "
                                              r"that line, or the whole file"):
        train(tmp_path, save_every=4)


def steps_kept(run_dir) -> list[str]:
    return sorted((p.name for p in (run_dir / "checkpoints").iterdir()),
                  key=lambda name: (len(name), name))


@pytest.mark.parametrize("keep, kept", [(2, ["step_4", "step_5"]), (0, None), (None, None)])
def test_keep_checkpoints_keeps_the_newest(tmp_path, keep, kept):
    train(tmp_path, max_steps=6, save_every=1, keep_checkpoints=keep)
    assert steps_kept(tmp_path / KIND) == (kept or [f"step_{i}" for i in range(1, 6)])


def test_old_checkpoints_go_only_after_a_newer_one_is_complete(runs, tmp_path, monkeypatch):
    original = checkpoint_module.save_rng_state
    calls = []

    def killed_during_the_fourth_save(path):
        calls.append(path)
        if len(calls) == 4:
            raise KeyboardInterrupt("simulated kill")
        original(path)

    monkeypatch.setattr(checkpoint_module, "save_rng_state", killed_during_the_fourth_save)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path, save_every=1, keep_checkpoints=2)
    monkeypatch.setattr(checkpoint_module, "save_rng_state", original)
    run_dir = tmp_path / KIND
    assert steps_kept(run_dir) == ["step_2", "step_3", "step_4.partial"]
    assert all((run_dir / "checkpoints" / f"step_{i}" / "progress.json").is_file() for i in (2, 3))

    out = train(tmp_path, save_every=1, keep_checkpoints=2)
    assert steps_kept(run_dir) == ["step_6", "step_7"]
    assert_same_weights(runs[0], load_file(out / "model.safetensors"))


@pytest.mark.parametrize("value", [-1, 1.5, "all"])
def test_keep_checkpoints_is_validated(value):
    with pytest.raises(DraftsmithError, match=r"train.keep_checkpoints ?=.*(integer|0 or null)"):
        build_recipe({"drafter": {"kind": KIND}, "train": {"keep_checkpoints": value}})


def fake_checkpoints(folder, steps: list[int], total: int, max_minutes) -> list:
    """Checkpoint folders holding only what pruning reads: progress.json of a wsd run."""
    settings = {"train.max_minutes": max_minutes, "train.warmup_steps": 0,
                "train.schedule": "wsd", "train.decay_fraction": 0.2}
    paths = []
    for step in steps:
        path = folder / f"step_{step}"
        path.mkdir(parents=True)
        (path / "progress.json").write_text(json.dumps(
            {"step": step, "total_steps": total, "planned": False, "budget": {"anchor": None},
             "run": {"settings": settings}}))
        paths.append(path)
    return paths


@pytest.mark.parametrize("steps, total, max_minutes, deleted", [
    ([3, 6, 9, 10], 10, 5.0, [3]),       # the newest two are in the decay: step 6 stays
    ([3, 6, 9, 10], 10, None, [3, 6]),   # no budget to extend: the newest two only
    ([3, 6, 7], 20, 5.0, [3]),           # a newest one is before the decay already
    ([2, 3, 9, 10], 10, 5.0, [2]),       # the newest before the decay, not an older one
])
def test_pruning_keeps_the_newest_checkpoint_from_before_the_decay(tmp_path, steps, total,
                                                                   max_minutes, deleted):
    """A budgeted run keeps its last stable-phase checkpoint beyond `keep_checkpoints`: training
    it on to a longer budget (a benchmark's `extends`) starts there."""
    paths = fake_checkpoints(tmp_path, steps, total, max_minutes)
    assert checkpoint_module.pruned(paths, 2) == [tmp_path / f"step_{s}" for s in deleted]
