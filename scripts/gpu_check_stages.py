"""The stages of scripts/gpu_check.py (its docstring says what each proves): each a function of
the `Stage` it runs in, returning what it found (`ok_all`: whether it passed), with the tiny
targets and drafters it needs from gpu_check_fixtures.py."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import gpu_check_fixtures as fixtures

if TYPE_CHECKING:
    from gpu_check import Stage

ROOT = Path(__file__).resolve().parents[1]
RECIPE_8B = ROOT / "recipes" / "llama-3.1-8b" / "eagle3.yaml"
TARGET_8B = "meta-llama/Llama-3.1-8B-Instruct"
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1",
          "--num_machines", "1", "--dynamo_backend", "no"]


def draftsmith_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "draftsmith", *args]


def env_stage(stage: Stage) -> dict:
    import platform

    import torch
    import transformers

    from draftsmith.target.precision import hardware_record

    info = {**hardware_record(stage.device), "python": platform.python_version(),
            "transformers": transformers.__version__}
    if stage.cuda:
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_bytes=props.total_memory,
                    cuda=torch.version.cuda, bf16=torch.cuda.is_bf16_supported())
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True)
        info["nvidia_smi"] = smi.stdout.strip()
    return info


def gate_stage(stage: Stage) -> dict:
    setup = fixtures.every_kind_gate(stage.work / "gate")
    device = ("--device", stage.device)
    greedy = stage.run("gate", draftsmith_cli(*fixtures.gate_args(
        setup, stage.work / "greedy", extra=device)))
    stage.save(greedy=greedy | _lossless(stage.work / "greedy"))
    methods = ["plain", "prompt_lookup", "drafter@eagle3", "drafter@dflash", "drafter@dspark",
               "drafter@medusa", "drafter@mtp", "drafter@eagle1"]
    sampling = fixtures.gate_args(setup, stage.work / "sampling", methods, extra=(
        *device, "--temperature", "1.0", "--lossless-samples", "60"))
    sampling[sampling.index("--batch-size") + 1] = "1"
    result = stage.run("gate", draftsmith_cli(*sampling)) | _lossless(stage.work / "sampling")
    stage.save(sampling=result)
    return {"ok_all": greedy["rc"] == 0 and result["rc"] == 0}


def _lossless(folder: Path) -> dict:
    path = folder / "eval.json"
    if not path.is_file():
        return {"eval_json": False}
    check = json.loads(path.read_text()).get("lossless_check", {})
    return {"checked": len(check.get("checked", [])), "failures": check.get("failures"),
            "guarantee": check.get("guarantee")}


def tiny_training_data(root: Path, rows: int = 64) -> Path:
    """`rows` random tokenized examples for the tiny target (48 tokens, the first 8 a prompt)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    path = root / "data.jsonl"
    with open(path, "w") as handle:
        for _ in range(rows):
            ids = torch.randint(2, 128, (48,), generator=generator).tolist()
            handle.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 8 + [1] * 40}) + "\n")
    return path


def tiny_recipe(root: Path, name: str, drafter: dict, **train) -> Path:
    """A training recipe for the tiny target in root/target on root/data.jsonl, written to
    root/name.yaml, its output in root/name."""
    import yaml

    recipe = {"target": {"name": str(root / "target"), "dtype": "auto"}, "drafter": drafter,
              "data": {"tokenized": str(root / "data.jsonl")},
              "train": {"max_steps": 40, "warmup_steps": 0, "lr": 2e-3, "batch_size": 8,
                        "eval_fraction": 0.0, "mixed_precision": "auto",
                        "output_dir": str(root / name), **train}}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def metrics_rows(run_dir: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl (none before its first step; a line still being
    written is left out)."""
    metrics = run_dir / "metrics.jsonl"
    rows = []
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows


def loss_rows(run_dir: Path) -> list[dict]:
    """The per-step rows (with a loss) of a run's metrics.jsonl."""
    return [row for row in metrics_rows(run_dir) if "loss" in row]


def train_stage(stage: Stage) -> dict:
    root = stage.work
    fixtures.save_target_and_draft(root)
    tiny_training_data(root)
    fsdp = ["--config_file", str(ROOT / "recipes/accelerate/fsdp.yaml")]
    runs = {"eagle3": ({"kind": "eagle3", "draft_vocab_size": 128, "ttt_steps": 3}, []),
            "dflash": ({"kind": "dflash", "block_size": 4, "num_layers": 1,
                        "anchors_per_sequence": 8}, []),
            "medusa2": ({"kind": "medusa", "num_heads": 2, "lora": True, "lora_r": 4}, []),
            "eagle3_fsdp": ({"kind": "eagle3", "draft_vocab_size": 128, "ttt_steps": 3}, fsdp)}
    drafters, ok = [], True
    for name, (drafter, config) in runs.items():
        recipe = tiny_recipe(root, name, drafter)
        mixed = [] if config else ["--mixed_precision", "bf16"]
        result = stage.run("train", [*LAUNCH, *config, *mixed, "-m", "draftsmith.train",
                                     "--config", str(recipe)], timeout=150)
        meta = root / name / "drafter" / "draftsmith_drafter.json"
        if meta.is_file():
            saved = json.loads(meta.read_text())
            keys = ("num_processes", "training_steps", "target_parameters_per_rank")
            result["saved"] = {k: saved.get(k) for k in keys}
            drafters += ["--drafter", f"{name}={root / name / 'drafter'}"]
        steps = loss_rows(root / name)
        result["loss_first_last"] = [steps[0]["loss"], steps[-1]["loss"]] if steps else None
        ok = ok and result["rc"] == 0
        stage.save(**{name: result})
    (root / "prompts.txt").write_text("Hi!\nName a colour.\nOk\nCount to ten.\n")
    evaluation = stage.run("eval_trained", draftsmith_cli(
        "eval", "--target", str(root / "target"), "--device", stage.device, *drafters,
        "--baselines", "--prompts", str(root / "prompts.txt"), "--max-new-tokens", "24",
        "--out", str(root / "eval")))
    summary = root / "eval" / "eval.json"
    if summary.is_file():
        evaluation["methods"] = {
            name: {k: row.get(k) for k in ("tau", "speedup", "tokens_per_second")}
            for name, row in json.loads(summary.read_text())["summary"]["all"].items()}
    stage.save(eval=evaluation)
    return {"ok_all": ok and evaluation["rc"] == 0}


def resume_stage(stage: Stage) -> dict:
    """EAGLE-3 on the tiny target through `accelerate launch`, 400 steps (a checkpoint every
    100): once straight, once stopped by SIGTERM (to the launch's process group, as a scheduler
    stops a job) after its 5th step and run again. The stopped run must save a checkpoint and
    exit 143, the second run resume from it, every step be trained once, and the final weights
    equal the straight run's."""
    from safetensors.torch import load_file

    root = stage.work
    fixtures.save_target_and_draft(root)
    tiny_training_data(root)
    drafter = {"kind": "eagle3", "draft_vocab_size": 128, "ttt_steps": 2}
    steps = {"max_steps": 400, "save_every": 100, "lr": 1e-3}

    def launch(name: str) -> list[str]:
        return [*LAUNCH, "-m", "draftsmith.train", "--config",
                str(tiny_recipe(root, name, drafter, **steps))]

    straight = stage.run("resume", launch("straight"), timeout=120)
    stage.save(straight=straight)
    stopped_dir = root / "stopped"
    stopped = stage.run("resume", launch("stopped"), timeout=120,
                        stop_when=lambda: len(loss_rows(stopped_dir)) >= 5)
    checkpoints = stopped_dir / "checkpoints"
    stopped["checkpoints"] = sorted(p.name for p in checkpoints.iterdir()) \
        if checkpoints.is_dir() else []
    stage.save(stopped=stopped)
    resumed = stage.run("resume", launch("stopped"), timeout=120)
    resumed["resumed_at_step"] = next((row["step"] for row in metrics_rows(stopped_dir)
                                       if "resumed" in row), None)
    trained = [row["step"] for row in loss_rows(stopped_dir)]
    resumed["every_step_once"] = trained == list(range(1, steps["max_steps"] + 1))
    stage.save(resumed=resumed)
    saved = [root / name / "drafter" / "model.safetensors" for name in ("straight", "stopped")]
    if not all(path.is_file() for path in saved):
        return {"ok_all": False, "error": "a run saved no drafter"}
    a, b = (load_file(path) for path in saved)
    identical = a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
    mechanics = (straight["rc"] == 0 and stopped["rc"] == 143 and bool(stopped["checkpoints"])
                 and resumed["rc"] == 0 and resumed["resumed_at_step"] is not None
                 and resumed["every_step_once"])
    return {"identical_weights": identical, "ok_all": mechanics and identical,
            "max_abs_diff": max(float((a[k].float() - b[k].float()).abs().max())
                                for k in a.keys() & b.keys())}


def offline_stage(stage: Stage) -> dict:
    """ShareGPT-shaped conversations answered again by the tiny target, its hidden states cached
    (`draftsmith data run`, on the stage's device), then EAGLE-3 trained from the cache through
    `accelerate launch` with `train.features=offline`."""
    import yaml

    root = stage.work
    fixtures.save_target_and_draft(root)
    rows = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"Question {i}: name a colour."},
        {"from": "gpt", "value": "Blue."}]} for i in range(24)]
    (root / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = {"target": {"name": str(root / "target"), "dtype": "auto"},
              "drafter": {"kind": "eagle3", "draft_vocab_size": 64, "ttt_steps": 2},
              "data": {"source": str(root / "chats.jsonl"), "max_length": 128,
                       "out_dir": str(root / "data"),
                       "regenerate": {"max_new_tokens": 24, "batch_size": 8, "shard_size": 8},
                       "cache": {"kinds": ["eagle3"], "shard_tokens": 512},
                       "draft_vocab_size": 64},
              "train": {"features": "offline", "max_steps": 20, "warmup_steps": 0, "lr": 2e-3,
                        "batch_size": 4, "eval_fraction": 0.0, "mixed_precision": "auto",
                        "output_dir": str(root / "train")}}
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    data = stage.run("offline", draftsmith_cli("data", "run", "--config", str(path),
                                               "--no-progress"), timeout=120)
    summary_path = root / "data" / "summary.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        cache = summary.get("cache", {})
        data["cache"] = {k: cache.get(k) for k in ("complete", "layers", "samples",
                                                   "bytes_per_token", "extraction")}
        data["new_tokens"] = summary.get("regeneration", {}).get("new_tokens")
    stage.save(data=data)
    train = stage.run("offline", [*LAUNCH, "-m", "draftsmith.train", "--config", str(path)],
                      timeout=120)
    steps = loss_rows(root / "train")
    train["steps"] = len(steps)
    train["loss_first_last"] = [steps[0]["loss"], steps[-1]["loss"]] if steps else None
    train["drafter_saved"] = (root / "train" / "drafter" / "model.safetensors").is_file()
    stage.save(train=train)
    return {"ok_all": data["rc"] == 0 and bool(data.get("cache", {}).get("complete"))
            and train["rc"] == 0 and train["drafter_saved"]}


def config_8b(small: bool):
    """Llama-3.1-8B's config as shipped (4 layers of width 512 when small)."""
    from draftsmith.plan.shapes import target_config

    config, _ = target_config(TARGET_8B)
    if small:
        config.update({"num_hidden_layers": 4, "hidden_size": 512, "intermediate_size": 1024,
                       "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64})
    return config


def target_8b(small: bool, device: str, layers: int | None = None):
    """The 8B target's config (`config_8b`; `layers` layers when given), a random model of it in
    the dtype `auto` chooses on `device` (measured on a CPU), and that choice."""
    import torch
    from transformers import AutoModelForCausalLM

    from draftsmith.target.precision import choose_dtype

    config = config_8b(small)
    if layers:
        config.update({"num_hidden_layers": layers})
    choice = choose_dtype("auto", device, config.hidden_size, config.intermediate_size)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, choice.dtype))
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    return config, model.eval().requires_grad_(False), choice


def drafter_step(kind: str, config, settings: dict, shape: tuple[int, int], device: str,
                 dtype: str):
    """A random drafter of `kind` for a target of `config` on `device`, a batch of random
    cached hidden states of `shape` (B, T) and a frozen random head: (drafter, step), where
    `step()` runs the kind's loss in `dtype` autocast and its backward, and returns the loss."""
    import torch

    from draftsmith.draft_vocab.vocab import build_draft_vocab
    from draftsmith.models.features import cached_features
    from draftsmith.registry import get_spec

    spec = get_spec(kind)
    torch.manual_seed(0)
    drafter = spec.build(config, spec.make_config(settings))
    vocab, hidden, layers = config.vocab_size, config.hidden_size, config.num_hidden_layers
    if spec.uses_draft_vocab and drafter.draft_vocab_size < vocab:
        counts = torch.randint(1, 1000, (vocab,), generator=torch.Generator().manual_seed(1))
        chosen = build_draft_vocab(counts, drafter.draft_vocab_size)
        drafter.set_draft_vocab(chosen.d2t, chosen.t2d)
    drafter = drafter.to(device).train()
    compute = getattr(torch, dtype)
    head = torch.nn.Linear(hidden, vocab, bias=False, device=device, dtype=compute)
    head.requires_grad_(False)
    aux = spec.aux_layers(layers, drafter.config)
    b, t = shape
    generator = torch.Generator(device).manual_seed(2)
    batch = {"input_ids": torch.randint(0, vocab, (b, t), device=device, generator=generator),
             "attention_mask": torch.ones(b, t, dtype=torch.long, device=device),
             "loss_mask": torch.ones(b, t, dtype=torch.long, device=device)}
    batch["loss_mask"][:, : t // 8] = 0  # a prompt
    for i in sorted({*(a + 1 for a in aux), layers}):
        batch[f"hidden_states.{i}"] = torch.randn(b, t, hidden, device=device, dtype=compute,
                                                  generator=generator)
    device_type = torch.device(device).type

    def step():
        with torch.autocast(device_type, dtype=compute, enabled=compute != torch.float32):
            loss, _ = spec.loss(drafter, cached_features(batch, head, aux, layers))
        loss.backward()
        return float(loss.detach())

    return drafter, step


def checkpointing_stage(stage: Stage) -> dict:
    """One EAGLE-3 training step of the 8B recipe's drafter on random cached hidden states of the
    recipe's batch (2 x 2,048; 1 x 128 when small), with `train.gradient_checkpointing` off and
    on: loss, largest gradient difference and peak memory of each."""
    import torch
    import yaml

    from draftsmith.models.layers import set_gradient_checkpointing
    from draftsmith.target.precision import choose_dtype

    config = config_8b(stage.small)
    shape = (1, 128) if stage.small else (2, 2048)
    settings = yaml.safe_load(RECIPE_8B.read_text())["drafter"]
    settings.pop("kind")
    dtype = choose_dtype("auto", stage.device, config.hidden_size, config.intermediate_size).dtype
    drafter, step = drafter_step("eagle3", config, settings, shape, stage.device, dtype)
    result = {"dtype": dtype, "tokens": list(shape),
              "decoder_layers": set_gradient_checkpointing(drafter, False)}
    step()  # warm-up: kernels chosen, the optimizer-free step's buffers allocated
    grads = {}
    for enabled in (False, True):
        set_gradient_checkpointing(drafter, enabled)
        drafter.zero_grad(set_to_none=True)
        if stage.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if stage.cuda else None
        start = time.perf_counter()
        loss = step()
        if stage.cuda:
            torch.cuda.synchronize()
        row = {"loss": loss, "seconds": round(time.perf_counter() - start, 3)}
        if stage.cuda:
            row["peak_step_bytes"] = torch.cuda.max_memory_allocated() - before
        grads[enabled] = {n: p.grad.detach().float().clone()
                          for n, p in drafter.named_parameters() if p.grad is not None}
        result["on" if enabled else "off"] = row
        stage.save(**result)
    scale = max(float(g.abs().max()) for g in grads[False].values())
    diff = max(float((grads[True][n] - g).abs().max()) for n, g in grads[False].items())
    result.update(same_parameters=grads[True].keys() == grads[False].keys(),
                  max_grad_diff_relative=diff / scale if scale else diff)
    if stage.cuda:
        result["memory_on_over_off"] = round(result["on"]["peak_step_bytes"]
                                             / result["off"]["peak_step_bytes"], 3)
    result["ok_all"] = (result["same_parameters"] and result["decoder_layers"] > 0
                        and result["on"]["loss"] == result["off"]["loss"]
                        and result["max_grad_diff_relative"] < 1e-2)
    return result


ATTENTION_NAMES = ("scaled_dot_product", "flash", "efficient_attention", "fmha", "cudnn_attention")


def attention_ops(prof) -> list[str]:
    """The attention operators and kernels a torch profile recorded (names cut to 120 chars)."""
    names = {event.key[:120] for event in prof.key_averages()}
    return sorted(n for n in names if any(a in n.lower() for a in ATTENTION_NAMES))


def profiled(stage: Stage, work) -> list[str]:
    """The attention operators and kernels of one call of `work()`, after a warm-up call (the
    first may pick kernels)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if stage.cuda else [])
    work()
    if stage.cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        work()
        if stage.cuda:
            torch.cuda.synchronize()
    return attention_ops(prof)


def target_attention(stage: Stage) -> dict:
    """The attention of a 2-layer target of the 8B shapes in draftsmith's cache runner: a
    128-token prefill, a one-token decode step and a 16-token tree of two branches verified."""
    import torch

    from draftsmith.decoding.runner import CausalLMRunner

    _, target, choice = target_8b(stage.small, stage.device, layers=2)
    runner = CausalLMRunner(target)
    prompt = torch.randint(0, target.config.vocab_size, (128,),
                           generator=torch.Generator().manual_seed(1)).to(stage.device)
    tree = torch.tril(torch.ones(16, 16, dtype=torch.bool, device=stage.device))
    tree[8:, :8] = False

    def prefill():
        runner.reset()
        runner.forward(prompt)
        runner.commit()

    def decode():
        runner.forward(prompt[:1])
        runner.rollback()

    def verify():
        runner.forward(prompt[:16], tree_mask=tree)
        runner.rollback()

    result = {"dtype": choice.dtype,
              "attn_implementation": getattr(target.config, "_attn_implementation", None)}
    for name, work in (("target_prefill", prefill), ("target_decode", decode),
                       ("target_verify_tree", verify)):
        result[name] = profiled(stage, work)
        stage.save(**result)
    return result


def attention_stage(stage: Stage) -> dict:
    """Which attention kernels run, per pass: the profiler's attention operators (the backend
    torch's scaled_dot_product_attention chose) and, on a GPU, its kernels, in the target's
    passes and an EAGLE-3 training step (its TTT attention). (DFlash and DSpark train with their
    own chunked attention, models/block_layers.py: no backend to choose.)"""
    result = target_attention(stage)
    config = config_8b(stage.small)  # the drafters read layer ids of the whole depth
    shape = (1, 64) if stage.small else (1, 256)
    _, step = drafter_step("eagle3", config, {"draft_vocab_size": 32000, "ttt_steps": 3}, shape,
                           stage.device, result["dtype"])
    result["eagle3_train_step"] = profiled(stage, step)
    result["ok_all"] = all(v for k, v in result.items() if k.startswith(("target_", "eagle3_")))
    return result


def target8b_stage(stage: Stage) -> dict:
    import torch

    from draftsmith.draft_vocab.vocab import build_draft_vocab
    from draftsmith.plan.report import format_report, plan_recipe
    from draftsmith.train.loop import make_accelerator, run_training
    from draftsmith.train.recipe import load_recipe

    config, target, choice = target_8b(stage.small, stage.device)
    work = stage.work
    overrides = [f"train.output_dir={work / 'train8b'}", "train.max_steps=6",
                 "train.warmup_steps=0", "train.save_every=100000", "train.eval_every=100000",
                 "train.eval_fraction=0.0", "train.wandb=false", f"target.dtype={choice.dtype}"]
    if stage.small:
        overrides.append("train.max_length=128")
    config_file = work / "target8b_config.json"
    config_file.write_text(config.to_json_string())
    gpu = torch.cuda.get_device_properties(0).total_memory if stage.cuda else None
    plan = plan_recipe(RECIPE_8B, overrides, gpu=f"{gpu / 2**30:.1f}GiB" if gpu else "cpu",
                       target_config=str(config_file))
    recipe = load_recipe(RECIPE_8B, overrides)
    length, vocab = recipe.train.max_length, config.vocab_size
    generator = torch.Generator().manual_seed(0)
    examples = [{"input_ids": torch.randint(0, vocab, (length,), generator=generator).tolist(),
                 "loss_mask": [1] * length} for _ in range(32)]
    counts = torch.zeros(vocab, dtype=torch.long)
    for example in examples:
        counts += torch.bincount(torch.tensor(example["input_ids"]), minlength=vocab)
    draft_vocab = build_draft_vocab(counts, min(recipe.drafter_config.draft_vocab_size, vocab))
    if stage.cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    weights = torch.cuda.memory_allocated() if stage.cuda else None
    start = time.perf_counter()
    run_training(recipe, examples, target=target, accelerator=make_accelerator(recipe),
                 draft_vocab=draft_vocab)
    seconds = time.perf_counter() - start
    steps = loss_rows(work / "train8b")
    result = {"dtype": choice.dtype, "dtype_reason": choice.reason,
              "plan_peak_bytes": plan.plan.peak, "plan": format_report(plan),
              "plan_terms": {t.name: t.bytes for t in plan.plan.terms},
              "target_weights_bytes": weights, "train_seconds": round(seconds, 1),
              "steps": len(steps), "step_seconds": [  # the log's seconds count from the start
                  round(b.get("seconds", 0) - a.get("seconds", 0), 3)
                  for a, b in zip([{}, *steps[:-1]], steps, strict=True)],
              "loss_first_last": [steps[0]["loss"], steps[-1]["loss"]] if steps else None}
    if stage.cuda:
        free, total = torch.cuda.mem_get_info()
        result.update(peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                      peak_reserved_bytes=torch.cuda.max_memory_reserved(),
                      device_used_bytes_after=total - free,
                      plan_over_peak_allocated=round(plan.plan.peak /
                                                     torch.cuda.max_memory_allocated(), 3))
    return result


def verify_stage(stage: Stage) -> dict:
    import torch

    from draftsmith.decoding.decode import generate
    from draftsmith.decoding.proposers.base import NoDraftProposer
    from draftsmith.decoding.runner import CausalLMRunner
    from draftsmith.eval.autotune import measure_verify_cost

    _, target, _ = target_8b(stage.small, stage.device)
    runner = CausalLMRunner(target)
    sizes = [1, 2, 4, 8, 16, 32, 64, 128]
    costs = measure_verify_cost(runner, sizes, context_len=512, repeats=5)
    result = {"verify_ms": {n: round(c * 1e3, 3) for n, c in costs.items()},
              "verify_ratio": {n: round(c / costs[1], 3) for n, c in costs.items()}}
    stage.save(**result)
    prompt = torch.randint(0, target.config.vocab_size, (1, 128),
                           generator=torch.Generator().manual_seed(1)).to(stage.device)
    new = 128
    for name in ("hf_generate", "hf_generate_again"):
        start = time.perf_counter()
        target.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        if stage.cuda:
            torch.cuda.synchronize()
        result[f"{name}_tokens_per_second"] = round(new / (time.perf_counter() - start), 1)
    for name in ("runner_plain", "runner_plain_again"):
        start = time.perf_counter()
        if stage.cuda:
            torch.cuda.synchronize()
        out = generate(runner, NoDraftProposer(), prompt[0].tolist(), new)
        result[f"{name}_tokens_per_second"] = round(len(out.tokens) /
                                                    (time.perf_counter() - start), 1)
    return result


def profile_stage(stage: Stage) -> dict:
    """Plain decoding of a tiny target through draftsmith's loop against transformers' generate,
    and where the loop's time goes (torch profiler, CPU-side operators by self time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from draftsmith.decoding.decode import generate
    from draftsmith.decoding.proposers.base import NoDraftProposer
    from draftsmith.decoding.runner import CausalLMRunner

    target = fixtures.tiny_target().to(stage.device)
    runner, prompt, new = CausalLMRunner(target), list(range(2, 34)), 64
    result = {}
    for name in ("runner_warm", "runner", "hf_warm", "hf"):
        start = time.perf_counter()
        if name.startswith("runner"):
            generate(runner, NoDraftProposer(), prompt, new)
        else:
            target.generate(torch.tensor([prompt], device=stage.device), max_new_tokens=new,
                            min_new_tokens=new, do_sample=False, pad_token_id=0)
        if stage.cuda:
            torch.cuda.synchronize()
        result[f"{name}_ms_per_token"] = round((time.perf_counter() - start) * 1e3 / new, 2)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if stage.cuda else [])
    with profile(activities=activities) as prof:
        generate(runner, NoDraftProposer(), prompt, new)
    result["runner_profile"] = prof.key_averages().table(sort_by="self_cpu_time_total",
                                                         row_limit=30)
    return result


# every stage with its own limit in seconds, in the order they run (the limits add up to more than
# the deadline on purpose: a fast machine runs every stage, a slow one those that fit)
STAGES = {"env": (env_stage, 60), "gate": (gate_stage, 150), "attention": (attention_stage, 90),
          "checkpointing": (checkpointing_stage, 90), "resume": (resume_stage, 150),
          "offline": (offline_stage, 120), "train": (train_stage, 200),
          "target8b": (target8b_stage, 150), "verify": (verify_stage, 90),
          "profile": (profile_stage, 60)}
