"""The proof in the engine: every (export format, engine) pair that runs on this machine, served by
the engine next to draftsmith's own loop on the same prompts, with drafters of middling acceptance.

    .venv/bin/python benchmarks/engine-proof/prove.py            # every pair, then results.json
    .venv/bin/python benchmarks/engine-proof/prove.py --old      # also the exports of issue 52's
                                                                  # cases 2-5, written the old way

Stages (each cached under --work, so a rerun resumes where it stopped):

1. data: SmolLM2-135M-Instruct (float32) answers the evaluation prompts greedily (the first turns of
   mt_bench and gsm8k items); the hidden states every drafter reads are computed once.
2. train: one small drafter per kind on those answers (AdamW, full batch), with non-default aux
   layer ids where the kind reads target layers, stopped as soon as its teacher-forced accuracy
   at the first draft position reaches its threshold (0.55; 0.4 for the block drafters) or its
   step cap: a drafter of middling acceptance on exactly these prompts. An overfit drafter
   (acceptance 1.0) accepts everything in every layout and detects nothing; an untrained one (0)
   neither.
3. pairs: each drafter exported in each format, served by the engine in float32 (vLLM's CPU build
   with dtype float32; llama.cpp with the target converted to an f32 GGUF) plain and with the
   draft, and decoded by draftsmith's loop (float32) from the trained checkpoint itself, all on
   the same prompts. A pair passes when the engine's speculative answers equal its plain ones (a
   divergence at a float32 near-tie, gap <= serve_check.TIE_GAP, is counted, not failed) and its
   acceptance at every draft position is within 2 points of the loop's.

Everything runs single-threaded (torch, vLLM's OMP threads, llama.cpp's --threads): on a shared
2-core machine OpenMP's spinning threads otherwise slow every process down several times.

Writes `results.json` beside this file: one row per pair (format, engine, engine version, passed,
acceptance per position in the engine and in the loop, prompts), and `--old` rows for the old
exports (expected to fail: that is the check catching them). See README.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from draftsmith.data.draft_vocab import build_draft_vocab
from draftsmith.data.prompts import load_prompts
from draftsmith.drafter_folder import read_drafter_weights, write_drafter_folder
from draftsmith.errors import DraftsmithError
from draftsmith.export.write import export_drafter
from draftsmith.files import write_json
from draftsmith.models.features import cached_features, extract_features, hidden_indices
from draftsmith.registry import get_spec
from draftsmith.serving.serve_check import (
    ServeCheckSettings,
    compare_outputs,
    engine_acceptance,
    prompt_token_ids,
    real_divergences,
    run_engine,
    run_vllm,
)
from draftsmith.serving.serve_check_run import check_servable_export, measure_divergences
from draftsmith.target.precision import hardware_record

HERE = Path(__file__).resolve().parent
TARGET = "smollm2-135m-instruct"
AUX = [4, 14, 24]  # SmolLM2 has 30 layers: EAGLE-3's default is [1, 14, 26], DFlash's [15]
DRAFT_MAX = 3
MAX_GAP = 0.02  # the bar: acceptance per position within 2 points of the loop's
MIDDLING = (0.3, 0.8)  # first-position acceptance that detects a mismatch
THREADS = 1

# drafter label -> (kind, settings, most training steps, lr, stop at teacher-forced acc_0,
# the drafter whose trained weights it starts from or None)
BLOCK = {"block_size": DRAFT_MAX + 1, "num_layers": 1, "target_layer_ids": AUX,
         "anchors_per_sequence": 32, "loss": "ce", "position_weights": "uniform"}
DRAFTERS = {
    "eagle1": ("eagle1", {"fc_bias": False}, 200, 3e-3, 0.55, None),
    "eagle3": ("eagle3", {"draft_vocab_size": 4096, "ttt_steps": DRAFT_MAX, "layer_ids": AUX},
               200, 3e-3, 0.55, None),
    "eagle3.1": ("eagle3", {"draft_vocab_size": 4096, "ttt_steps": DRAFT_MAX, "layer_ids": AUX,
                            "fc_norm": True, "norm_output": True}, 200, 3e-3, 0.55, None),
    # a block drafter learns these answers far more slowly (its head is the target's, frozen;
    # measured on these 12 answers: acc_0 0.05-0.11 after 60-90 steps at lr 3e-3 or 1e-2, still
    # 0.05 after 73 of a 250-step run): capped at 80 steps, below the middling band (see README)
    "dflash": ("dflash", BLOCK, 80, 1e-2, 0.4, None),
    # the same drafter with its head cut to the answers' 4,096 most frequent tokens (d2t):
    # issue 52 case 7, a draft vocabulary vLLM must serve as draftsmith decodes it
    "dflash-vocab": ("dflash", {**BLOCK, "draft_vocab_size": 4096}, 0, 1e-2, 0.4, "dflash"),
    "dspark": ("dspark", {"block_size": DRAFT_MAX, "num_layers": 1, "target_layer_ids": AUX,
                          "markov_rank": 64, "anchors_per_sequence": 32}, 80, 1e-2, 0.4, None),
    "medusa": ("medusa", {"num_heads": DRAFT_MAX, "num_layers": 1}, 200, 3e-3, 0.55, None),
}
# (drafter label, export format, engine); `gguf` is `draftsmith export --format gguf`
PAIRS = [
    ("eagle3", "gguf", "llama.cpp"),
    ("dflash", "gguf", "llama.cpp"),
    ("dspark", "gguf", "llama.cpp"),
    ("eagle3", "eagle3", "vllm"),
    ("eagle3", "speculators", "vllm"),
    ("dflash", "dflash", "vllm"),
    ("dflash", "dflash-speculators", "vllm"),
    ("eagle3.1", "eagle3", "vllm"),
    ("eagle3.1", "speculators", "vllm"),
    ("dspark", "dspark", "vllm"),
    ("medusa", "medusa", "vllm"),
    ("eagle1", "eagle", "vllm"),
    ("dflash-vocab", "dflash", "vllm"),
    ("dflash-vocab", "dflash-speculators", "vllm"),
]
# issue 52's cases 2-5: (name, drafter label, format, engine, what the old export did)
OLD = [
    ("case2-eagle1-fc-bias", "eagle1-bias", "eagle", "vllm",
     "EAGLE-1 with a trained fc bias, which vLLM's EagleLlamaForCausalLM drops"),
    ("case3-dflash-speculators-causal", "dflash", "dflash-speculators", "vllm",
     "sliding_window_non_causal: false, which vLLM's update_dflash turns into causal layers"),
    ("case4-medusa-no-fc-bias", "medusa", "medusa", "vllm",
     "no medusa_fc_bias, so vLLM 0.32 builds the ResBlocks without their trained biases"),
    ("case5-eagle3-ids-in-eagle-config-only", "eagle3", "eagle3", "vllm",
     "aux ids only in eagle_config.eagle_aux_hidden_state_layer_ids, which vLLM reads as layer "
     "inputs (older runner) or not at all (newer runner: default ids)"),
]
OLD_DRAFTERS = {"eagle1-bias": ("eagle1", {"fc_bias": True}, 200, 3e-3, 0.55, None)}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------- prompts and data

def eval_prompts(count: int):
    """The evaluation prompts: the first turns of the first `count` // 2 mt_bench and gsm8k
    items."""
    return [p for name in ("mt_bench", "gsm8k") for p in load_prompts(name, count // 2)]


@torch.no_grad()
def make_data(target, prompts, new_tokens: int, work: Path) -> list[dict]:
    """One batch of (prompt + the target's greedy answer) per 8 prompts with the hidden states
    the drafters read, cached in `work/data.pt`."""
    path = work / "data.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)  # our own cache: tensors and lists only
    model, tokenizer = target.model, target.tokenizer
    rows = []
    ids = prompt_token_ids(tokenizer, prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for start in range(0, len(ids), 16):
        chunk = ids[start:start + 16]
        width = max(map(len, chunk))
        left = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        out = model.generate(left, attention_mask=mask, max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=pad)
        for prompt, row in zip(chunk, out[:, width:].tolist(), strict=True):
            answer = []
            for token in row:
                answer.append(token)
                if token in target.eos_token_ids:
                    break
            rows.append((prompt, answer))
        log(f"data: {len(rows)}/{len(ids)} answers")
    indices = hidden_indices(model.config.num_hidden_layers, AUX)
    batches = []
    for start in range(0, len(rows), 8):
        chunk = rows[start:start + 8]
        width = max(len(p) + len(a) for p, a in chunk)
        input_ids = torch.full((len(chunk), width), pad)
        attention = torch.zeros_like(input_ids)
        loss_mask = torch.zeros_like(input_ids)
        for i, (p, a) in enumerate(chunk):
            input_ids[i, :len(p) + len(a)] = torch.tensor(p + a)
            attention[i, :len(p) + len(a)] = 1
            loss_mask[i, len(p):len(p) + len(a)] = 1
        batches.append({"input_ids": input_ids, "attention_mask": attention,
                        "loss_mask": loss_mask,
                        **extract_features(model, input_ids, attention, indices)})
    torch.save(batches, path)
    return batches


# ---------------------------------------------------------------- training

def train_drafter(target, label: str, batches: list[dict], work: Path, table: dict) -> Path:
    """Train drafter `label` on the cached batches and write draftsmith's checkpoint folder."""
    folder = work / "drafters" / label
    if (folder / "draftsmith_drafter.json").is_file():
        return folder
    kind, settings, steps, lr, stop_at, start_from = table[label]
    spec = get_spec(kind)
    config = spec.make_config(settings)
    torch.manual_seed(0)
    model = target.model
    vocab = model.config.vocab_size
    module = spec.build(model.config, config)
    if spec.uses_draft_vocab and module.draft_vocab_size < vocab:
        counts = torch.zeros(vocab, dtype=torch.int64)
        for b in batches:
            counts += torch.bincount(b["input_ids"][b["loss_mask"] > 0], minlength=vocab)
        draft = build_draft_vocab(counts, module.draft_vocab_size)
        module.set_draft_vocab(draft.d2t, draft.t2d)
    module.init_from_target(model)
    if start_from:  # its trained weights; the head stays the target's rows of its vocabulary
        trained = read_drafter_weights(train_drafter(target, start_from, batches, work, table))
        module.load_state_dict({k: v for k, v in trained.items()
                                if not k.startswith(("lm_head.", "d2t", "t2d"))}, strict=False)
    layers = model.config.num_hidden_layers
    aux = spec.aux_layers(layers, config)
    head = model.get_output_embeddings()
    if hasattr(module, "init_from_data") and not start_from:
        module.init_from_data(cached_features(batches[0], head, aux, layers))
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    started = time.perf_counter()
    module.train()
    acc = {}
    step = -1
    for step in range(steps + 1):  # one step = every batch (the whole data), gradients summed
        optimizer.zero_grad()
        sums: dict[str, float] = {}
        for batch in batches:
            loss, metrics = spec.loss(module, cached_features(batch, head, aux, layers))
            (loss / len(batches)).backward()
            for k, v in metrics.items():
                if k.startswith("acc_"):
                    sums[k] = sums.get(k, 0.0) + float(v) / len(batches)
        acc = {k: round(v, 4) for k, v in sorted(sums.items())}
        log(f"train {label}: step {step + 1} loss {loss.item():.3f} teacher-forced {acc}")
        if acc.get("acc_0", 0.0) >= stop_at or step == steps:  # measured before the update
            break
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
    module.eval()
    steps = step  # updates made
    seconds = round(time.perf_counter() - started, 1)
    log(f"train {label}: {steps} steps, {seconds} s, teacher-forced {acc}")
    tensors = {k: v.detach().contiguous() for k, v in module.state_dict().items()
               if not k.startswith("rotary.")}
    meta = {"kind": kind, "drafter_config": asdict(config), "target": TARGET,
            "target_config": model.config.to_dict(), "aux_layers": list(aux),
            "training_steps": steps, "train_seconds": seconds, "num_processes": 1, "lora": False,
            "eval": {"teacher_forced": acc},
            "recipe": {"target": {"name": TARGET}, "drafter": {"kind": kind, **settings},
                       "data": {"source": "engine-proof: the target's greedy answers to the "
                                          "evaluation prompts"},
                       "train": {"lr": lr, "batch_size": "all", "max_steps": steps,
                                 "optimizer": "adamw", "stop_at_acc_0": stop_at,
                                 "started_from": start_from}}}
    write_drafter_folder(folder, tensors, meta)
    return folder


# ---------------------------------------------------------------- exports

def export_pair(checkpoint: Path, fmt: str, out: Path, target_dir: Path) -> tuple[Path, Path]:
    """(the export folder or GGUF folder, the file or folder the engine serves)."""
    if out.exists():
        shutil.rmtree(out)
    if fmt == "gguf":
        from draftsmith.export.gguf_export import export_gguf

        folder = export_gguf(checkpoint, out, target_dir=target_dir, log=log)
        return folder, next(folder.glob("*.gguf"))
    folder = export_drafter(checkpoint, fmt, out)
    return folder, folder


def write_old_export(name: str, export: Path) -> None:
    """Rewrite a new export the way draftsmith wrote it before issue 52's fixes."""
    config = json.loads((export / "config.json").read_text())
    if name.startswith("case2"):
        return  # the export is right; what vLLM does with a trained fc bias is the point
    if name.startswith("case3"):
        config["sliding_window_non_causal"] = False
    elif name.startswith("case4"):
        config.pop("medusa_fc_bias")
    elif name.startswith("case5"):
        config.pop("eagle_aux_hidden_state_layer_ids")
        config["eagle_config"].pop("layer_ids")
    (export / "config.json").write_text(json.dumps(config, indent=2))


# ---------------------------------------------------------------- engines and the loop

_LOOPS: dict[str, list] = {}


def loop_runs(float32_target, checkpoint: Path, ids, new_tokens: int) -> list:
    """draftsmith's loop on the trained checkpoint (a chain of DRAFT_MAX, greedy, float32): one
    `generate` result per prompt, cached per drafter."""
    from draftsmith.decoding.decode import generate
    from draftsmith.decoding.runner import CausalLMRunner
    from draftsmith.eval.methods import make_drafter_proposer
    from draftsmith.eval.settings import DecodeSettings
    from draftsmith.export.load import load_any_drafter

    key = str(checkpoint)
    if key not in _LOOPS:
        target = float32_target()
        drafter = load_any_drafter(checkpoint, target.model)
        runner = CausalLMRunner(target.model, output_hidden_states=True)
        settings = DecodeSettings(num_draft_tokens=DRAFT_MAX)
        _LOOPS[key] = [generate(runner, make_drafter_proposer("drafter_chain", drafter, settings),
                                prompt, new_tokens, target.eos_token_ids) for prompt in ids]
        log(f"loop {checkpoint.name}: {len(ids)} prompts decoded")
    return _LOOPS[key]


def loop_per_position(results: list, skip: int) -> tuple[list[float], int]:
    """Acceptance per draft position over `results` as the engines count it: drafts whose
    position k was accepted over all drafts, the first `skip` steps of each answer left out.
    Returns (rates, drafts)."""
    accepted = [a for r in results for a in r.accepted_per_step[skip:]]
    drafted = [d for r in results for d in r.depth_per_step[skip:]]
    drafts = sum(1 for d in drafted if d > 0)
    return [round(sum(1 for a in accepted if a > k) / drafts, 4) if drafts else 0.0
            for k in range(DRAFT_MAX)], drafts


def engine_per_position(answers: list) -> tuple[list[float], int]:
    """The engine's acceptance per draft position over `answers` (its per-request counters)."""
    drafts = sum(a.drafts for a in answers)
    return [round(sum(a.accepted_per_position[k] for a in answers) / drafts, 4) if drafts
            else 0.0 for k in range(DRAFT_MAX)], drafts


def serve(engine: str, served: Path, method: str, target_dir: Path, ids, settings,
          out: Path):
    """(plain run, speculative run, engine record) of the engine on `ids`."""
    if engine == "vllm":
        from draftsmith.engines.vllm import engine_record

        plain = run_vllm(target_dir, ids, settings, out / "engine_plain.log", log=log,
                         dtype="float32")
        spec = run_vllm(target_dir, ids, settings, out / f"engine_{method}.log",
                        {"method": method, "model": str(served.resolve()),
                         "num_speculative_tokens": DRAFT_MAX}, log, dtype="float32")
        return plain, spec, engine_record()
    from draftsmith.engines.llama_cpp import DraftOptions, engine_record
    from draftsmith.serving.target_gguf import converted_target_gguf

    gguf = converted_target_gguf(target_dir, "f32", log)
    plain = _LLAMA_PLAIN.get(str(gguf)) or run_engine(gguf, ids, settings,
                                                      out / "engine_plain.log", log=log)
    _LLAMA_PLAIN[str(gguf)] = plain
    spec = run_engine(gguf, ids, settings, out / f"engine_{method}.log",
                      DraftOptions(served, spec_type=method, draft_max=DRAFT_MAX), log)
    return plain, spec, engine_record()


_LLAMA_PLAIN: dict[str, object] = {}


def prove_pair(name: str, label: str, fmt: str, engine: str, checkpoint: Path, prompts, ids,
               float32_target, target_dir: Path, work: Path, new_tokens: int,
               old: str | None = None) -> dict:
    """Serve one pair and compare it with the loop; returns its results row."""
    out = work / "pairs" / name
    started = time.perf_counter()
    meta = json.loads((checkpoint / "draftsmith_drafter.json").read_text())
    kind = get_spec(meta["kind"])
    export, served = export_pair(checkpoint, fmt, out / "export", target_dir)
    if old:
        write_old_export(name, export)
    elif fmt != "gguf":  # serve-check's checks (a GGUF export applied them when written)
        check_servable_export(export, target_dir, engine)
    method = kind.engine_methods[engine]
    engine_label = "vllm" if engine == "vllm" else "llamacpp"
    settings = ServeCheckSettings(draft_max=DRAFT_MAX, max_new_tokens=new_tokens,
                                  threads=THREADS, engine=engine,
                                  dtype="float32" if engine == "vllm" else "auto",
                                  target_outtype="f32" if engine == "llama.cpp" else None)
    row = {"name": name, "format": fmt, "engine": engine, "drafter": label, "kind": kind.kind,
           "prompts": len(ids), "max_new_tokens": new_tokens, "draft_max": DRAFT_MAX}
    try:
        plain, spec, record = serve(engine, served, method, target_dir, ids, settings, out)
    except DraftsmithError as err:  # a load failure is a result too
        return {**row, "engine_version": None, "passed": False,
                "error": str(err).splitlines()[0][:400],
                "seconds": round(time.perf_counter() - started, 1)}
    stats = engine_acceptance(spec, DRAFT_MAX, engine_label)
    records = compare_outputs(prompts, plain, spec)
    measure_divergences(float32_target, ids, plain, [records], log)
    loops = loop_runs(float32_target, checkpoint, ids, new_tokens)
    skip = 0  # the loop, as both engines, takes its first new token from the prefill
    # compared where the engine's speculative answer is the loop's text: after a near-tie the
    # two decode different text, whose acceptance says nothing about the export
    same = [n for n, (a, r) in enumerate(zip(spec.answers, loops, strict=True))
            if a.tokens == r.tokens]
    engine_rates, engine_drafts = engine_per_position([spec.answers[n] for n in same])
    loop_rates, loop_drafts = loop_per_position([loops[n] for n in same], skip)
    loop_all, _ = loop_per_position(loops, skip)
    gaps = [abs(a - b) for a, b in zip(engine_rates, loop_rates, strict=True)]
    bad = real_divergences(records)
    identical = sum(r["identical"] for r in records)
    first = loop_all[0]
    write_json(out / "records.json", {"records": records, "same_text_as_loop": same,
                                      "engine": [asdict(a) for a in spec.answers]})
    row.update({
        "engine_name": record["engine"], "engine_version": record["version"],
        "passed": not bad and len(same) * 2 >= len(ids) and max(gaps) <= MAX_GAP,
        "acceptance_per_position_engine": engine_rates,
        "acceptance_per_position_loop": loop_rates,
        "max_gap": round(max(gaps), 4),
        "prompts_compared": len(same),
        "drafts_engine": engine_drafts, "drafts_loop": loop_drafts,
        "identical": [identical, len(records)],
        "near_ties": len(records) - identical - len(bad),
        "all_prompts": {"acceptance_per_position_engine": stats["acceptance_per_position"],
                        "acceptance_per_position_loop": loop_all, "tau_engine": stats["tau"]},
        "middling": MIDDLING[0] <= first <= MIDDLING[1],
        "aux_layer_ids": meta["aux_layers"] if kind.reads_aux_layers else None,
        "seconds": round(time.perf_counter() - started, 1)})
    if old:
        row["old_export"] = old
    return row


# ---------------------------------------------------------------- main

def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=HERE)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="runs/engine-proof",
                        help="cache of data, drafters, exports and engine logs")
    parser.add_argument("--engines", default="vllm,llama.cpp")
    parser.add_argument("--only", help="comma list of pair names (see results.json) to run")
    parser.add_argument("--old", action="store_true",
                        help="also serve exports written the old way (issue 52 cases 2-5)")
    parser.add_argument("--redo", action="store_true",
                        help="serve again the pairs results.json already holds")
    parser.add_argument("--prompts", type=int, default=12, help="evaluation prompts")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args(argv)

    from draftsmith.serving.serve_check_run import target_folder
    from draftsmith.target.load import load_target

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    engines = args.engines.split(",")
    torch.set_num_threads(THREADS)
    target = load_target(TARGET, dtype="float32")
    target_dir = target_folder(TARGET)
    prompts = eval_prompts(args.prompts)
    ids = prompt_token_ids(target.tokenizer, prompts)
    batches = make_data(target, prompts, args.new_tokens, work)
    jobs = [(f"{label}/{fmt}/{engine}", label, fmt, engine, None)
            for label, fmt, engine in PAIRS if engine in engines]
    if args.old:
        jobs += [(name, label, fmt, engine, what) for name, label, fmt, engine, what in OLD
                 if engine in engines]
    # the block drafters train longest: their pairs last
    jobs.sort(key=lambda job: job[1] in ("dflash", "dflash-vocab", "dspark"))
    if args.only:
        wanted = set(args.only.split(","))
        jobs = [job for job in jobs if job[0] in wanted]
    results_path = Path(args.out)
    previous = json.loads(results_path.read_text()) if results_path.is_file() else {}
    rows = {r["name"]: r for r in previous.get("pairs", []) + previous.get("old_exports", [])}
    for name, label, fmt, engine, old in jobs:
        if name in rows and not args.redo:  # a pair results.json already holds
            continue
        table = {**DRAFTERS, **OLD_DRAFTERS}
        checkpoint = train_drafter(target, label, batches, work, table)
        log(f"pair {name}")
        rows[name] = prove_pair(name.replace("/", "-"), label, fmt, engine, checkpoint, prompts,
                                ids, lambda: target, target_dir, work, args.new_tokens, old)
        rows[name]["name"] = name
        row = rows[name]
        log(f"pair {name}: passed={row['passed']} engine "
            f"{row.get('acceptance_per_position_engine')} loop "
            f"{row.get('acceptance_per_position_loop')} {row.get('error', '')}")
        pairs = [r for r in rows.values() if "old_export" not in r]
        olds = [r for r in rows.values() if "old_export" in r]
        write_json(results_path, {
            "schema": 1, "target": TARGET, "dtype": "float32", "prompts": len(ids),
            "prompt_sets": ["mt_bench", "gsm8k"], "max_new_tokens": args.new_tokens,
            "draft_max": DRAFT_MAX, "max_gap": MAX_GAP, "middling": list(MIDDLING),
            "command": "python benchmarks/engine-proof/prove.py" + (" --old" if args.old else ""),
            "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
            "hardware": hardware_record(), "pairs": pairs, "old_exports": olds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
