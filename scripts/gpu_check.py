"""One short check of draftsmith on a GPU, sized for a lent machine's few minutes: each stage runs
the real code path a GPU user runs and writes what it found to OUT/gpu_check.json (after every
stage, so a run cut short keeps what it did), its commands' output to OUT/*.log.

    python scripts/gpu_check.py --out DIR [--device cuda] [--stages env,gate,...] [--small]

Stages:
  gate      `draftsmith eval --check-lossless --device cuda`: every registered drafter kind and
            variant (random drafters on a tiny random target), each default tree, chain and
            prompt-lookup hybrid, at batch sizes 1 and 2, float32 greedy; then the sampling gate
            (chi-square of the first tokens) for one kind per family
  train     `accelerate launch -m draftsmith.train` (bf16 mixed precision, dtype auto) of EAGLE-3,
            DFlash and Medusa-2 (joint LoRA via peft) on the tiny target, EAGLE-3 again under the
            FSDP2 config with one process, then the default `draftsmith eval --device cuda` of
            the trained drafters with the baselines
  target8b  the Llama-3.1-8B EAGLE-3 recipe's training step (batch 2 x grad_accum 2 x 2,048
            tokens, every position trained) on a randomly initialised target of the real shapes:
            peak GPU memory against `draftsmith plan` for this GPU, and seconds per step
  profile   plain decoding of the tiny target, draftsmith's loop against transformers' generate,
            with the loop's operators by CPU time
  verify    the verify-cost curve of that target (bf16, batch 1, after 512 tokens) and plain
            decoding tokens/s through draftsmith's runner against transformers' generate
--small shrinks the 8B target to 4 layers of width 512 (to try the script on a CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
STAGES = ("env", "gate", "target8b", "verify", "train", "profile")
RECIPE_8B = ROOT / "recipes" / "llama-3.1-8b" / "eagle3.yaml"
TARGET_8B = "meta-llama/Llama-3.1-8B-Instruct"


class Check:
    """The JSON record, rewritten after each stage."""

    def __init__(self, out: Path, device: str):
        self.out, self.device = out, device
        self.record: dict = {"device": device, "stages": {}}
        out.mkdir(parents=True, exist_ok=True)

    def stage(self, name: str, work) -> None:
        start = time.perf_counter()
        try:
            result = work()
            result = {"ok": result.pop("ok_all", True), **result}
        except Exception as err:  # a failed stage is the finding: record it and go on
            result = {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000],
                      "traceback": traceback.format_exc()[-4000:]}
        result["seconds"] = round(time.perf_counter() - start, 1)
        self.record["stages"][name] = result
        (self.out / "gpu_check.json").write_text(json.dumps(self.record, indent=1) + "\n")
        print(f"[{name}] {'ok' if result['ok'] else 'FAILED'} in {result['seconds']} s", flush=True)

    def run(self, name: str, command: list[str], timeout: float = 300) -> dict:
        """A command in its own process; its output to OUT/name.log; rc and the output's tail."""
        start = time.perf_counter()
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                  env=env, cwd=ROOT)
            rc, text = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as err:
            rc, text = "timeout", f"{err.stdout or ''}{err.stderr or ''}"
        with open(self.out / f"{name}.log", "a", encoding="utf-8") as log:
            log.write(f"$ {' '.join(command)}\n{text}\n")
        return {"rc": rc, "seconds": round(time.perf_counter() - start, 1), "tail": text[-1500:]}


def draftsmith_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "draftsmith", *args]


def env_stage(device: str) -> dict:
    import torch
    import transformers

    from draftsmith.precision import hardware_record

    info = {**hardware_record(device), "python": platform.python_version(),
            "transformers": transformers.__version__}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_bytes=props.total_memory,
                    cuda=torch.version.cuda, bf16=torch.cuda.is_bf16_supported())
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True)
        info["nvidia_smi"] = smi.stdout.strip()
    return info


def gate_stage(check: Check, work: Path) -> dict:
    from tests.helpers.gate import every_kind_gate, gate_args

    setup = every_kind_gate(work / "gate")
    device = ("--device", check.device)
    greedy = check.run("gate", draftsmith_cli(*gate_args(setup, work / "greedy", extra=device)))
    result = {"greedy": greedy | _lossless(work / "greedy")}
    methods = ["plain", "prompt_lookup", "drafter@eagle3", "drafter@dflash", "drafter@dspark",
               "drafter@medusa", "drafter@mtp", "drafter@eagle1"]
    sampling = gate_args(setup, work / "sampling", methods, extra=(
        *device, "--temperature", "1.0", "--lossless-samples", "60"))
    sampling[sampling.index("--batch-size") + 1] = "1"
    result["sampling"] = check.run("gate", draftsmith_cli(*sampling)) | _lossless(
        work / "sampling")
    result["ok_all"] = greedy["rc"] == 0 and result["sampling"]["rc"] == 0
    return result


def _lossless(folder: Path) -> dict:
    path = folder / "eval.json"
    if not path.is_file():
        return {"eval_json": False}
    check = json.loads(path.read_text()).get("lossless_check", {})
    return {"checked": len(check.get("checked", [])), "failures": check.get("failures"),
            "guarantee": check.get("guarantee")}


def train_stage(check: Check, work: Path) -> dict:
    import torch
    import yaml

    from tests.helpers.tiny_targets import save_target_and_draft

    root = work / "train"
    save_target_and_draft(root)
    generator = torch.Generator().manual_seed(0)
    with open(root / "data.jsonl", "w") as handle:
        for _ in range(64):
            ids = torch.randint(2, 128, (48,), generator=generator).tolist()
            handle.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 8 + [1] * 40}) + "\n")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1",
              "--num_machines", "1", "--dynamo_backend", "no"]
    runs = {"eagle3": ({"kind": "eagle3", "draft_vocab_size": 128, "ttt_steps": 3}, []),
            "dflash": ({"kind": "dflash", "block_size": 4, "num_layers": 1,
                        "anchors_per_sequence": 8}, []),
            "medusa2": ({"kind": "medusa", "num_heads": 2, "lora": True, "lora_r": 4}, []),
            "eagle3_fsdp": ({"kind": "eagle3", "draft_vocab_size": 128, "ttt_steps": 3},
                            ["--config_file", str(ROOT / "recipes/accelerate/fsdp.yaml")])}
    result, drafters = {}, []
    for name, (drafter, config) in runs.items():
        recipe = {"target": {"name": str(root / "target"), "dtype": "auto"}, "drafter": drafter,
                  "data": {"tokenized": str(root / "data.jsonl")},
                  "train": {"max_steps": 40, "warmup_steps": 0, "lr": 2e-3, "batch_size": 8,
                            "eval_fraction": 0.0, "mixed_precision": "auto",
                            "output_dir": str(root / name)}}
        (root / f"{name}.yaml").write_text(yaml.safe_dump(recipe))
        mixed = [] if config else ["--mixed_precision", "bf16"]
        command = [*launch, *config, *mixed, "-m", "draftsmith.train", "--config",
                   str(root / f"{name}.yaml")]
        result[name] = check.run("train", command, timeout=150)
        meta = root / name / "drafter" / "draftsmith_drafter.json"
        if meta.is_file():
            saved = json.loads(meta.read_text())
            keys = ("num_processes", "training_steps", "target_parameters_per_rank")
            result[name]["saved"] = {k: saved.get(k) for k in keys}
            drafters += ["--drafter", f"{name}={root / name / 'drafter'}"]
        metrics = root / name / "metrics.jsonl"
        if metrics.is_file():
            rows = [json.loads(line) for line in metrics.read_text().splitlines()]
            steps = [row for row in rows if "loss" in row]
            result[name]["loss_first_last"] = [steps[0]["loss"], steps[-1]["loss"]] if steps \
                else None
    (root / "prompts.txt").write_text("Hi!\nName a colour.\nOk\nCount to ten.\n")
    evaluation = check.run("eval_trained", draftsmith_cli(
        "eval", "--target", str(root / "target"), "--device", check.device, *drafters,
        "--baselines", "--prompts", str(root / "prompts.txt"), "--max-new-tokens", "24",
        "--out", str(root / "eval")))
    summary = root / "eval" / "eval.json"
    if summary.is_file():
        evaluation["methods"] = {
            name: {k: row.get(k) for k in ("tau", "speedup", "tokens_per_second")}
            for name, row in json.loads(summary.read_text())["summary"]["all"].items()}
    result["eval"] = evaluation
    result["ok_all"] = all(r["rc"] == 0 for r in result.values() if isinstance(r, dict))
    return result


def target_8b(small: bool, device: str):
    """The 8B target's config (4 layers of width 512 when small), a random model of it in the
    dtype `auto` chooses on `device` (measured on a CPU), and that choice."""
    import torch
    from transformers import AutoModelForCausalLM

    from draftsmith.plan.shapes import target_config
    from draftsmith.precision import choose_dtype

    config, _ = target_config(TARGET_8B)
    if small:
        config.update({"num_hidden_layers": 4, "hidden_size": 512, "intermediate_size": 1024,
                       "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64})
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


def target8b_stage(check: Check, work: Path, small: bool) -> dict:
    import torch

    from draftsmith.data.draft_vocab import build_draft_vocab
    from draftsmith.plan.report import format_report, plan_recipe
    from draftsmith.train.loop import make_accelerator, run_training
    from draftsmith.train.recipe import load_recipe

    config, target, choice = target_8b(small, check.device)
    overrides = [f"train.output_dir={work / 'train8b'}", "train.max_steps=6",
                 "train.warmup_steps=0", "train.save_every=100000", "train.eval_every=100000",
                 "train.eval_fraction=0.0", "train.wandb=false", f"target.dtype={choice.dtype}"]
    config_file = work / "target8b_config.json"
    config_file.write_text(config.to_json_string())
    gpu = check.record["stages"].get("env", {}).get("gpu_memory_bytes")
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
    draft_vocab = build_draft_vocab(counts, min(recipe.drafter_config().draft_vocab_size, vocab))
    cuda = check.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    weights = torch.cuda.memory_allocated() if cuda else None
    start = time.perf_counter()
    run_training(recipe, examples, target=target, accelerator=make_accelerator(recipe),
                 draft_vocab=draft_vocab)
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in (work / "train8b" / "metrics.jsonl").read_text()
            .splitlines()]
    steps = [row for row in rows if "loss" in row]
    result = {"dtype": choice.dtype, "dtype_reason": choice.reason,
              "plan_peak_bytes": plan.plan.peak, "plan": format_report(plan),
              "plan_terms": {t.name: t.bytes for t in plan.plan.terms},
              "target_weights_bytes": weights, "train_seconds": round(seconds, 1),
              "steps": len(steps), "step_seconds": [  # the log's seconds count from the start
                  round(b.get("seconds", 0) - a.get("seconds", 0), 3)
                  for a, b in zip([{}, *steps[:-1]], steps, strict=True)],
              "loss_first_last": [steps[0]["loss"], steps[-1]["loss"]] if steps else None}
    if cuda:
        free, total = torch.cuda.mem_get_info()
        result.update(peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                      peak_reserved_bytes=torch.cuda.max_memory_reserved(),
                      device_used_bytes_after=total - free,
                      plan_over_peak_allocated=round(plan.plan.peak /
                                                     torch.cuda.max_memory_allocated(), 3))
    check.target = target
    return result


def verify_stage(check: Check, small: bool) -> dict:
    import torch

    from draftsmith.decoding.runner import CausalLMRunner
    from draftsmith.eval.autotune import measure_verify_cost

    target = getattr(check, "target", None)
    if target is None:
        _, target, _ = target_8b(small, check.device)
    runner = CausalLMRunner(target)
    sizes = [1, 2, 4, 8, 16, 32, 64, 128]
    costs = measure_verify_cost(runner, sizes, context_len=512, repeats=5)
    result = {"verify_ms": {n: round(c * 1e3, 3) for n, c in costs.items()},
              "verify_ratio": {n: round(c / costs[1], 3) for n, c in costs.items()}}
    prompt = torch.randint(0, target.config.vocab_size, (1, 128),
                           generator=torch.Generator().manual_seed(1)).to(check.device)
    new = 128
    for name in ("hf_generate", "hf_generate_again"):
        start = time.perf_counter()
        target.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        if check.device.startswith("cuda"):
            torch.cuda.synchronize()
        result[f"{name}_tokens_per_second"] = round(new / (time.perf_counter() - start), 1)
    from draftsmith.decoding.decode import generate
    from draftsmith.decoding.proposers.base import NoDraftProposer

    for name in ("runner_plain", "runner_plain_again"):
        start = time.perf_counter()
        if check.device.startswith("cuda"):
            torch.cuda.synchronize()
        out = generate(runner, NoDraftProposer(), prompt[0].tolist(), new)
        result[f"{name}_tokens_per_second"] = round(len(out.tokens) /
                                                    (time.perf_counter() - start), 1)
    return result


def profile_stage(check: Check) -> dict:
    """Plain decoding of a tiny target through draftsmith's loop against transformers' generate,
    and where the loop's time goes (torch profiler, CPU-side operators by self time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from draftsmith.decoding.decode import generate
    from draftsmith.decoding.proposers.base import NoDraftProposer
    from draftsmith.decoding.runner import CausalLMRunner
    from tests.helpers.tiny_targets import tiny_target

    target = tiny_target("llama").to(check.device)
    runner, prompt, new = CausalLMRunner(target), list(range(2, 34)), 64
    result = {}
    for name in ("runner_warm", "runner", "hf_warm", "hf"):
        start = time.perf_counter()
        if name.startswith("runner"):
            generate(runner, NoDraftProposer(), prompt, new)
        else:
            target.generate(torch.tensor([prompt], device=check.device), max_new_tokens=new,
                            min_new_tokens=new, do_sample=False, pad_token_id=0)
        if check.device.startswith("cuda"):
            torch.cuda.synchronize()
        result[f"{name}_ms_per_token"] = round((time.perf_counter() - start) * 1e3 / new, 2)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if check.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        generate(runner, NoDraftProposer(), prompt, new)
    result["runner_profile"] = prof.key_averages().table(sort_by="self_cpu_time_total",
                                                         row_limit=30)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    check = Check(Path(args.out), args.device)
    stages = args.stages.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        check.stage("env", lambda: env_stage(args.device))
        if "gate" in stages:
            check.stage("gate", lambda: gate_stage(check, work))
        if "target8b" in stages:
            check.stage("target8b", lambda: target8b_stage(check, work, args.small))
        if "verify" in stages:
            check.stage("verify", lambda: verify_stage(check, args.small))
        check.target = None  # the 8B target's memory back before the training runs
        if args.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
        if "profile" in stages:
            check.stage("profile", lambda: profile_stage(check))
        if "train" in stages:
            check.stage("train", lambda: train_stage(check, work))
    return 0 if all(s["ok"] for s in check.record["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
