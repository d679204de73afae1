"""The serve-check run end to end: validate the export and the target's files (`check_targets`:
checksums, the GGUF against the target, the engine's Python), convert the export, run the engine
plain and with the draft, optionally run draftsmith's loop, write `serve_check.json` and print the
table."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.eval.prompts.sets import BenchPrompt
from draftsmith.files import write_json
from draftsmith.llama_cpp.server import DraftOptions, engine_record
from draftsmith.serving.serve_check import (
    DEFAULT_DRAFT_MAX,
    ServeCheckSettings,
    compare_outputs,
    engine_acceptance,
    failures,
    print_table,
    prompt_token_ids,
    run_engine,
    run_vllm,
)

RESULT = "serve_check.json"


def target_files(spec: str, target_gguf: str | None = None, target_outtype: str | None = None,
                 log: Callable[[str], None] = print) -> tuple[Path, Path]:
    """(target GGUF llama.cpp serves, Hugging Face folder the converter and the loop read);
    `check_targets` verifies them. `target_outtype`: serve the folder converted to a GGUF of that
    type instead (`target_gguf.converted_target_gguf`).

    Raises:
        DraftsmithError: an offline model not fetched, or a folder target without `--target-gguf`
            or `--target-outtype`.
    """
    from draftsmith.llama_cpp.target_gguf import converted_target_gguf
    from draftsmith.target import offline_models

    folder = target_folder(spec)
    if target_outtype:
        return converted_target_gguf(folder, target_outtype, log), folder
    if spec in offline_models.CATALOG:
        return (Path(target_gguf) if target_gguf else offline_models.gguf_path(spec)), folder
    if not target_gguf:
        raise DraftsmithError(f"--target {spec!r} is a folder: llama.cpp also needs "
                              "--target-gguf FILE (the same model as GGUF) or --target-outtype "
                              "f32 (converted from the folder)")
    return Path(target_gguf), folder


def check_targets(spec: str, target_gguf: str | None, engine: str,
                  log: Callable[[str], None] = print,
                  target_outtype: str | None = None) -> tuple[Path | None, Path, dict]:
    """Resolve and verify what the engine serves, before any conversion or model load: the
    engine's own Python (`$DRAFTSMITH_*_PYTHON`), an offline model's converted folder (its
    recorded sha256s) and, for llama.cpp, the target GGUF (`target_gguf.check_target_gguf`).

    Returns:
        (target GGUF or None for vLLM, the target's Hugging Face folder, the GGUF's record).

    Raises:
        DraftsmithError: whatever is missing, corrupted or of another model, named.
    """
    from draftsmith.engines.engine_env import own_engine_python
    from draftsmith.llama_cpp.convert import OUTTYPES
    from draftsmith.llama_cpp.target_gguf import check_target_gguf

    if (target_gguf or target_outtype) and engine != "llama.cpp":
        raise DraftsmithError("--target-gguf and --target-outtype are for --engine llama.cpp; vLLM "
                              "serves the target's Hugging Face folder (--target)")
    if target_gguf and target_outtype:
        raise DraftsmithError("give --target-gguf FILE or --target-outtype TYPE, not both: the "
                              "first serves your GGUF, the second converts the target's folder")
    if target_outtype and target_outtype not in OUTTYPES:
        raise DraftsmithError(f"--target-outtype {target_outtype!r}: choose one of "
                              f"{', '.join(OUTTYPES)} (f32: the weights the loop decodes)")
    own_engine_python(engine)
    if engine != "llama.cpp":
        return None, target_folder(spec), {}
    gguf, folder = target_files(spec, target_gguf, target_outtype, log)
    record = check_target_gguf(gguf, spec, folder, log)
    return gguf, folder, {**record, **({"target_outtype": target_outtype} if target_outtype
                                       else {})}


def require_export_folder(export_dir: Path) -> None:
    """Raises DraftsmithError unless `export_dir` is an export folder (before any model loads)."""
    from draftsmith.export.load import is_exported_folder

    if not export_dir.is_dir():
        raise DraftsmithError(f"export folder {export_dir} does not exist; write one with "
                              "`draftsmith export CKPT --format eagle3 --out DIR`")
    if not is_exported_folder(export_dir):
        raise DraftsmithError(f"{export_dir} holds no config.json: not an export folder "
                              "(`draftsmith export CKPT --format eagle3 --out DIR`)")


def check_servable_export(export_dir: Path, target_dir: Path, engine: str):
    """The export read back (an `ExportedDrafter`); raises DraftsmithError unless it is of a kind
    `engine` serves (`DrafterSpec.engine_methods`) and fits the target."""
    from draftsmith.export.cli import load_target_config
    from draftsmith.export.load import check_exported
    from draftsmith.registry import get_spec, served_by

    drafter = check_exported(export_dir, load_target_config(str(target_dir)))
    spec = get_spec(drafter.kind)
    if engine not in spec.engine_methods:
        raise DraftsmithError(f"{export_dir} is a {drafter.kind} drafter ({drafter.format} layout); "
                              f"serve-check runs in {engine} the exports of "
                              f"{' / '.join(served_by(engine))} drafters")
    unserved = spec.unserved_by(spec.make_config(drafter.settings))
    if engine in unserved:
        raise DraftsmithError(f"serve-check --engine {engine}: {export_dir}: {unserved[engine]}")
    return drafter


def draft_length(drafter, settings: ServeCheckSettings) -> ServeCheckSettings:
    """`settings` with its draft length settled: a block drafter's whole block (the engines'
    DFlash drafts it, so the loop's chain is that block too), else `draft_max`, else eval's
    `--num-draft-tokens` (`DEFAULT_DRAFT_MAX` without eval's settings). Raises DraftsmithError
    for a draft length (`--block-length`) other than a block drafter's block."""
    from draftsmith.registry import get_spec

    shift = getattr(get_spec(drafter.kind).build, "label_shift", None)
    block, decode = drafter.settings.get("block_size"), settings.decode
    if shift is None or block is None:
        chain = decode.num_draft_tokens if decode else DEFAULT_DRAFT_MAX
        return replace(settings, draft_max=settings.draft_max or chain)
    proposals = int(block) - 1 + shift
    asked = settings.draft_max or (decode.block_length if decode else None)
    if asked not in (None, proposals):
        raise DraftsmithError(f"--block-length {asked}: this {drafter.kind} export drafts its "
                              f"whole block, {proposals} tokens (block_size {block}), in the "
                              "engine; drop --block-length or pass that")
    return replace(settings, draft_max=proposals)


def run_serve_check(export_dir: str | Path, target: str, prompts: list[BenchPrompt],
                    out_dir: str | Path, settings: ServeCheckSettings,
                    target_gguf: str | None = None, log: Callable[[str], None] = print,
                    checked: tuple | None = None) -> dict:
    """Run the check and write `out_dir/serve_check.json`; returns the summary. `checked` is what
    `check_targets` returned when the caller ran it first (else it runs here).

    Raises:
        DraftsmithError: bad inputs, the engine failing to load the draft (its log's tail quoted),
            or the check failing (outputs differ, acceptance below the floor); the JSON is
            written first in the last case.
    """
    from draftsmith.engines.engine_env import require_gpu_engine
    from draftsmith.registry import get_spec
    from draftsmith.target.load import load_tokenizer
    from draftsmith.target.precision import hardware_record

    export_dir, out_dir = Path(export_dir), Path(out_dir)
    if not prompts:
        raise DraftsmithError("serve-check got no prompts (check --bench / --prompts / --limit)")
    require_gpu_engine(settings.engine, settings.device)
    require_export_folder(export_dir)
    gguf, target_dir, gguf_record = checked or check_targets(
        target, target_gguf, settings.engine, log, settings.target_outtype)
    drafter = check_servable_export(export_dir, target_dir, settings.engine)
    settings = draft_length(drafter, settings)
    method = get_spec(drafter.kind).engine_methods[settings.engine]
    ids = prompt_token_ids(load_tokenizer(str(target_dir)), prompts)
    started = time.perf_counter()
    if settings.engine == "vllm":
        options = get_spec(drafter.kind).engine_options.get("vllm", {})
        (plain, spec, served), more = _run_vllm(export_dir, target_dir, ids, settings,
                                                (method, options), out_dir, log), {}
    else:
        plain, spec, served, more = _run_llama_cpp(export_dir, target_dir, gguf, ids, settings,
                                                   method, out_dir, log)
        served.update(gguf_record)
    prefix = served.pop("metric_prefix")
    engine = _engine_stats(spec, plain, settings.draft_max, prefix)
    records = compare_outputs(prompts, plain, spec)
    if more:  # every draft type: the engine's own numbers, one plain run for all
        served["draft_types"] = {
            outtype: {**_engine_stats(run, plain, settings.draft_max, prefix),
                      "draft_gguf_bytes": path.stat().st_size,
                      "identical": [sum(r["identical"] for r in compared), len(compared)],
                      "differing": [r for r in compared if not r["identical"]]}
            for outtype, (run, path) in more.items()
            for compared in [compare_outputs(prompts, plain, run)]}
    @functools.cache
    def float32_target():  # loaded once, for the divergences and the loop
        from draftsmith.target.load import load_target

        return load_target(str(target_dir), dtype="float32", device=settings.device)

    measure_divergences(float32_target, ids, plain, [records, *(
        run["differing"] for run in served.get("draft_types", {}).values())], log)
    summary = {
        **served, "target": target, "export_dir": str(export_dir), "kind": drafter.kind,
        "export_format": drafter.format,
        "draft_max": settings.draft_max, "max_new_tokens": settings.max_new_tokens,
        "prompts": len(prompts), "prompt_sets": sorted({p.set_name for p in prompts}),
        "identical": [sum(r["identical"] for r in records), len(records)],
        "engine_threads": settings.threads, "device": settings.device,
        "engine_stats": engine, "records": records,
        "hardware": hardware_record(),
    }
    if settings.loop:
        log("draftsmith's own loop on the same prompts and drafter (float32)")
        loop = loop_summary(float32_target(), export_dir, ids, settings, spec)
        summary["draftsmith"] = loop
    summary["seconds"] = round(time.perf_counter() - started, 1)
    summary["passed"] = not failures(summary, settings)
    write_json(out_dir / RESULT, summary)
    print_table(summary, log)
    problems = failures(summary, settings)
    if problems:
        raise DraftsmithError("serve-check failed:\n- " + "\n- ".join(problems)
                              + f"\n(details: {out_dir / RESULT}; engine logs in {out_dir})")
    log(f"ok: {out_dir / RESULT}")
    return summary


def _engine_stats(run, plain, draft_max: int, prefix: str) -> dict:
    """The engine's acceptance and tau for one speculative run, and its speed against `plain`."""
    engine = engine_acceptance(run, draft_max, prefix)
    engine["tokens_per_second_spec"] = round(run.tokens_per_second, 2)
    engine["tokens_per_second_plain"] = round(plain.tokens_per_second, 2)
    engine["speedup"] = round(run.tokens_per_second / max(plain.tokens_per_second, 1e-9), 3)
    return engine


def measure_divergences(float32_target: Callable, ids: list[list[int]], plain, record_lists,
                        log) -> None:
    """Set `tie_gap` on every differing record of `record_lists` (see `serve_check.TIE_GAP`);
    `float32_target()` gives the target in float32, called only when something differs."""
    from draftsmith.serving.serve_check_loop import divergence_gaps

    where: dict[tuple, list[dict]] = {}  # one forward per distinct divergence
    for records in record_lists:
        for record in records:
            if not record["identical"] and "plain_token" in record:
                key = (record["prompt_index"], record["first_difference"], record["plain_token"],
                       record["spec_token"])
                where.setdefault(key, []).append(record)
    if not where:
        return
    cases = [(ids[n], plain.answers[n].tokens[:first], a, b) for n, first, a, b in where]
    log(f"{len(cases)} divergence(s): measuring the target's float32 logit gap where they part")
    for records, gap in zip(where.values(), divergence_gaps(float32_target(), cases),
                            strict=True):
        for record in records:
            record["tie_gap"] = gap


def unrecognized_pre_tokenizer(message: str, target_dir: Path) -> str | None:
    """What to do when llama.cpp's converter stopped at the target tokenizer's pre-tokenizer
    (`BPE pre-tokenizer was not recognized`), or None for another failure. A draft GGUF carries
    the target's vocabulary, which the converter reads from `target_dir`; it knows a BPE
    tokenizer only by the hash of its output on a fixed text, and a tokenizer rebuilt from a GGUF
    (the offline catalog's) can hash differently from the upstream one it came from."""
    if "pre-tokenizer was not recognized" not in message:
        return None
    return (f"llama.cpp's convert_hf_to_gguf.py does not recognize the BPE pre-tokenizer of the "
            f"target tokenizer in {target_dir} (it knows tokenizers by the hash of their output "
            "on a fixed text; one rebuilt from a GGUF, as the offline models' are, can differ "
            "from the upstream one), so it cannot write the draft GGUF's vocabulary. Next: pass "
            "as --target a folder with the model's upstream tokenizer (`huggingface-cli download "
            "ORG/NAME --local-dir DIR`, the Hub id `draftsmith models list` names for an offline "
            "model), or check the export with --engine vllm, which reads the Hugging Face folders "
            "as they are")


def _run_llama_cpp(export_dir: Path, target_dir: Path, gguf: Path, ids: list[list[int]],
                   settings: ServeCheckSettings, spec_type: str, out_dir: Path, log) -> tuple:
    """(plain run, the first draft type's speculative run, what served them, {draft type:
    (its run, its GGUF)} when more than one type is asked) in llama.cpp with the converted draft
    under `--spec-type spec_type`."""
    from draftsmith.export.gguf import convert_to_gguf

    types = settings.draft_outtypes
    try:
        drafts = {outtype: convert_to_gguf(  # a draft the converter refuses fails before any run
            export_dir, target_dir, out_dir / ("draft.gguf" if outtype == "f32" else
                                               f"draft-{outtype}.gguf"), log, outtype)
            for outtype in types}
    except DraftsmithError as err:
        raise DraftsmithError(unrecognized_pre_tokenizer(str(err), target_dir) or str(err)) \
            from None
    plain = run_engine(gguf, ids, settings, out_dir / "engine_plain.log", log=log)
    runs = {}
    for outtype, draft_gguf in drafts.items():
        draft = DraftOptions(draft_gguf, spec_type=spec_type, draft_max=settings.draft_max)
        tag = spec_type.removeprefix('draft-') + ("" if outtype == "f32" else f"-{outtype}")
        runs[outtype] = run_engine(gguf, ids, settings, out_dir / f"engine_{tag}.log", draft,
                                   log), draft_gguf
    spec, draft_gguf = runs[types[0]]
    record = engine_record()
    return plain, spec, {"engine": record["engine"], "version": record["version"],
                         "target_gguf": str(gguf), "draft_gguf": str(draft_gguf),
                         "draft_outtype": types[0], "spec_type": spec_type,
                         "metric_prefix": "llamacpp"}, runs if len(types) > 1 else {}


def _run_vllm(export_dir: Path, target_dir: Path, ids: list[list[int]],
              settings: ServeCheckSettings, method: tuple[str, dict], out_dir: Path,
              log) -> tuple:
    """(plain run, speculative run, what served them) in vLLM with the export as written, under
    speculative `method`: its name and the other keys its speculative config needs
    (`DrafterSpec.engine_options`)."""
    method, options = method
    from draftsmith.engines import vllm
    from draftsmith.export.cli import load_target_config
    from draftsmith.target.precision import choose_dtype

    config = load_target_config(str(target_dir))  # the engine's dtype measured as `auto` chooses
    choice = choose_dtype(settings.dtype, settings.device, config.hidden_size,
                          getattr(config, "intermediate_size", None))
    log(f"vLLM dtype: {choice.dtype} ({choice.reason})")
    speculative = {"method": method, "model": str(export_dir.resolve()),
                   "num_speculative_tokens": settings.draft_max, **options}
    plain = run_vllm(target_dir, ids, settings, out_dir / "engine_plain.log", log=log,
                     dtype=choice.dtype)
    spec = run_vllm(target_dir, ids, settings, out_dir / f"engine_{method}.log", speculative, log,
                    dtype=choice.dtype)
    record = vllm.engine_record()
    reused = {"plain_run_reused_from": plain.reused_from} if plain.reused_from else {}
    return plain, spec, {"engine": record["engine"], "version": record["version"],
                         "target_dir": str(target_dir), "speculative_config": speculative,
                         "dtype": choice.dtype, "dtype_reason": choice.reason,
                         "metric_prefix": "vllm", **reused}


def target_folder(spec: str) -> Path:
    """The target's Hugging Face folder (vLLM serves it): an offline model's, its files checked
    against the sha256s recorded when it was converted (hashed once per size and mtime), or a
    folder.

    Raises:
        DraftsmithError: an offline model not fetched or corrupted, or no model folder.
    """
    from draftsmith.target import offline_models

    if spec in offline_models.CATALOG:
        if not offline_models.is_fetched(spec):
            raise DraftsmithError(f"target {spec} is not fetched: run `draftsmith models fetch "
                                  f"{spec}`")
        offline_models.verify_converted(spec, cached=True)
        return offline_models.model_dir(spec)
    if not (Path(spec) / "config.json").is_file():
        raise DraftsmithError(f"--target {spec!r}: give an offline model name "
                              f"({', '.join(offline_models.CATALOG)}) or a Hugging Face folder")
    return Path(spec)


def loop_summary(target, export_dir: Path, ids: list[list[int]],
                 settings: ServeCheckSettings, spec) -> dict:
    """draftsmith's loop numbers, with how many of its answers equal the engine's."""
    from draftsmith.serving.serve_check_loop import loop_acceptance

    loop = loop_acceptance(target, export_dir, ids, settings.max_new_tokens, settings.loop_decode())
    answers = loop.pop("answers")
    loop["same_answer_as_engine"] = [sum(a == b.tokens for a, b in zip(answers, spec.answers, strict=True)),
                                     len(answers)]
    return loop
