"""The proof in the engine: every (export format, engine) pair that runs on this machine, served by
the engine next to draftsmith's own loop on the same prompts, with drafters of middling acceptance.

    .venv/bin/python benchmarks/engine-proof/prove.py            # every pair, then results.json
    .venv/bin/python benchmarks/engine-proof/prove.py --old      # also the exports of issue 52's
                                                                  # cases 2-5, written the old way

Stages (each cached under --work, so a rerun resumes where it stopped; stages 1 and 2 are
fixture.py's):

1. data: SmolLM2-135M-Instruct (float32) answers the evaluation prompts greedily (the first turns of
   mt_bench and gsm8k items); the hidden states every drafter reads are computed once.
2. train: one small drafter per kind on those answers (AdamW, full batch), with non-default aux
   layer ids where the kind reads target layers, stopped as soon as its teacher-forced accuracy
   at the first draft position reaches its threshold (0.55; 0.4 for the block drafters) or its
   step cap: a drafter of middling acceptance on exactly these prompts. An overfit drafter
   (acceptance 1.0) accepts everything in every layout and detects nothing; an untrained one (0)
   neither; nor does a bias the old export drops if it stays near zero, so the drafters of the
   old exports start with large biases.
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
exports (expected to fail: that is the check catching them), each with its fixed twin (the same
drafter exported, or refused, as draftsmith does now: expected to pass). See README.md.
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
from fixture import (
    DRAFT_MAX,
    DRAFTERS,
    OLD_DRAFTERS,
    TARGET,
    eval_prompts,
    log,
    make_data,
    train_drafter,
)

from draftsmith.errors import DraftsmithError
from draftsmith.export.write import export_drafter
from draftsmith.files import write_json
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
MAX_GAP = 0.02  # the bar: acceptance per position within 2 points of the loop's
MIDDLING = (0.3, 0.8)  # first-position acceptance that detects a mismatch
THREADS = 1

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
# issue 52's cases 2-5: (name, drafter label, format, engine, what the old export did); each is
# served beside its fixed twin, the same drafter exported (or refused) as draftsmith does now
OLD = [
    ("case2-eagle1-fc-bias", "eagle1-bias", "eagle", "vllm",
     "EAGLE-1 with a trained fc bias, which vLLM's EagleLlamaForCausalLM drops"),
    ("case3-dflash-speculators-causal", "dflash", "dflash-speculators", "vllm",
     "sliding_window_non_causal: false, which vLLM's update_dflash turns into causal layers"),
    ("case4-medusa-no-fc-bias", "medusa-bias", "medusa", "vllm",
     "no medusa_fc_bias, so vLLM 0.32 builds the ResBlocks without their trained biases"),
    ("case5-eagle3-ids-in-eagle-config-only", "eagle3", "eagle3", "vllm",
     "aux ids only in eagle_config.eagle_aux_hidden_state_layer_ids, which vLLM reads as layer "
     "inputs (older runner) or not at all (newer runner: default ids)"),
]
# what an old row keeps of its fixed twin's row
FIXED_KEYS = ("name", "passed", "refused", "error", "acceptance_per_position_engine",
              "acceptance_per_position_loop", "max_gap", "prompts_compared")


# ---------------------------------------------------------------- exports

def export_pair(checkpoint: Path, fmt: str, out: Path, target_dir: Path) -> tuple[Path, Path]:
    """(the export folder or GGUF folder, the file or folder the engine serves)."""
    if out.exists():
        shutil.rmtree(out)
    if fmt == "gguf":
        folder = export_drafter(checkpoint, "gguf", out, target_dir=target_dir, log=log)
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
    from draftsmith.llama_cpp.server import DraftOptions, engine_record
    from draftsmith.llama_cpp.target_gguf import converted_target_gguf

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
    row = {"name": name, "format": fmt, "engine": engine, "drafter": label, "kind": kind.kind,
           "prompts": len(ids), "max_new_tokens": new_tokens, "draft_max": DRAFT_MAX}
    export, served = export_pair(checkpoint, fmt, out / "export", target_dir)
    if old:
        write_old_export(name, export)
    elif fmt != "gguf":  # serve-check's checks (a GGUF export applied them when written)
        try:
            check_servable_export(export, target_dir, engine)
        except DraftsmithError as err:  # refused: the engine would serve another drafter
            return {**row, "engine_version": None, "passed": None,
                    "refused": str(err).splitlines()[0][:400]}
    method = kind.engine_methods[engine]
    engine_label = "vllm" if engine == "vllm" else "llamacpp"
    settings = ServeCheckSettings(draft_max=DRAFT_MAX, max_new_tokens=new_tokens,
                                  threads=THREADS, engine=engine,
                                  dtype="float32" if engine == "vllm" else "auto",
                                  target_outtype="f32" if engine == "llama.cpp" else None)
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


def write_results(path: Path, rows: dict, args, prompts: int) -> None:
    """results.json from the rows by name: the pairs, the old exports each with its fixed twin's
    row in brief (`fixed_export`), and the twins that are no pair (`fixed_twins`)."""
    pair_names = {f"{label}/{fmt}/{engine}" for label, fmt, engine in PAIRS}
    for name, label, fmt, engine, _ in OLD:
        twin = rows.get(f"{label}/{fmt}/{engine}")
        if name in rows and twin:
            rows[name]["fixed_export"] = {k: twin[k] for k in FIXED_KEYS if k in twin}
    write_json(path, {
        "schema": 1, "target": TARGET, "dtype": "float32", "prompts": prompts,
        "prompt_sets": ["mt_bench", "gsm8k"], "max_new_tokens": args.new_tokens,
        "draft_max": DRAFT_MAX, "max_gap": MAX_GAP, "middling": list(MIDDLING),
        "command": "python benchmarks/engine-proof/prove.py" + (" --old" if args.old else ""),
        "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
        "hardware": hardware_record(),
        "pairs": [r for n, r in rows.items() if n in pair_names],
        "old_exports": [r for r in rows.values() if "old_export" in r],
        "fixed_twins": [r for n, r in rows.items()
                        if n not in pair_names and "old_export" not in r]})


def job_list(args) -> list[tuple]:
    """(name, drafter label, format, engine, what the old export did or None) to run: the pairs,
    with --old the old exports and their fixed twins that are no pair; block drafters last."""
    engines = args.engines.split(",")
    jobs = [(f"{label}/{fmt}/{engine}", label, fmt, engine, None)
            for label, fmt, engine in PAIRS if engine in engines]
    if args.old:
        for name, label, fmt, engine, what in OLD:
            if engine in engines:
                twin = (f"{label}/{fmt}/{engine}", label, fmt, engine, None)
                jobs += [(name, label, fmt, engine, what)] + ([twin] if twin not in jobs else [])
    # the block drafters train longest: their pairs last
    jobs.sort(key=lambda job: job[1] in ("dflash", "dflash-vocab", "dspark"))
    if args.only:
        wanted = set(args.only.split(","))
        jobs = [job for job in jobs if job[0] in wanted]
    return jobs


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
    torch.set_num_threads(THREADS)
    target = load_target(TARGET, dtype="float32")
    target_dir = target_folder(TARGET)
    prompts = eval_prompts(args.prompts)
    ids = prompt_token_ids(target.tokenizer, prompts)
    batches = make_data(target, prompts, args.new_tokens, work)
    results_path = Path(args.out)
    previous = json.loads(results_path.read_text()) if results_path.is_file() else {}
    rows = {r["name"]: r for key in ("pairs", "old_exports", "fixed_twins")
            for r in previous.get(key, [])}
    table = {**DRAFTERS, **OLD_DRAFTERS}
    for name, label, fmt, engine, old in job_list(args):
        if name in rows and not args.redo:  # a pair results.json already holds
            continue
        checkpoint = train_drafter(target, label, batches, work, table)
        log(f"pair {name}")
        row = prove_pair(name.replace("/", "-"), label, fmt, engine, checkpoint, prompts, ids,
                         lambda: target, target_dir, work, args.new_tokens, old)
        rows[name] = {**row, "name": name}
        log(f"pair {name}: passed={row['passed']} engine "
            f"{row.get('acceptance_per_position_engine')} loop "
            f"{row.get('acceptance_per_position_loop')} {row.get('error', row.get('refused', ''))}")
        write_results(results_path, rows, args, len(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
