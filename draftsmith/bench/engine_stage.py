"""The benchmark's engine stage: trained drafters exported and run by real serving engines next to
draftsmith's own loop (`draftsmith serve-check --loop`), on the benchmark's prompts (first turns),
so BENCHMARKS.md has the engine-vs-loop tables: llama.cpp (the draft converted to GGUF in each of
`outtypes`, the target's GGUF) and, when listed in a check's `engines`, vLLM (its CPU build, the
export as written, the target's folder in float32).

Layout under `out_dir/engine/<drafter label>/`: `export/` (the kind's first export format, which
every engine of the check reads) and one folder per engine (`llama.cpp/`, `vllm/`) with the engine
logs and `serve_check.json`. An engine whose `serve_check.json` exists is skipped. A check that
fails (outputs differ, acceptance ~0) is recorded with `passed: false` and reported; it does not
stop the benchmark.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.bench.config import BenchConfig
from draftsmith.errors import DraftsmithError

RESULT = "serve_check.json"


def engine_folder(out_dir: str | Path, engine: str, drafter: str) -> Path:
    return Path(out_dir) / "engine" / drafter / engine


def check_name(drafter: str, engine: str) -> str:
    """The key of one check in bench.json: `eagle3 in llama.cpp`."""
    return f"{drafter} in {engine}"


def _checks(config: BenchConfig):
    for spec in config.engine_checks():
        for engine in spec.get("engines", ["llama.cpp"]):
            yield spec, engine


def engine_check(config: BenchConfig, log=print) -> dict:
    """Run (or read) every engine check: {check name: serve_check summary}."""
    return {check_name(spec["drafter"], engine): _check_one(config, spec, engine, log)
            for spec, engine in _checks(config)}


def read_engine_checks(config: BenchConfig) -> dict:
    """The finished engine checks, without running any."""
    found = {}
    for spec, engine in _checks(config):
        path = engine_folder(config.out_dir, engine, spec["drafter"]) / RESULT
        if path.is_file():
            found[check_name(spec["drafter"], engine)] = json.loads(path.read_text())
    return found


def _check_one(config: BenchConfig, spec: dict, engine: str, log) -> dict:
    from draftsmith.eval.prompts.files import gather_prompts
    from draftsmith.export.formats import formats_for_kind
    from draftsmith.export.source import read_checkpoint
    from draftsmith.export.write import export_drafter
    from draftsmith.registry import get_spec
    from draftsmith.serving.serve_check import ServeCheckSettings
    from draftsmith.serving.serve_check_run import run_serve_check

    folder = engine_folder(config.out_dir, engine, spec["drafter"])
    if (folder / RESULT).is_file():
        return json.loads((folder / RESULT).read_text())
    drafter = Path(config.out_dir) / "train" / spec["drafter"] / "drafter"
    export = folder.parent / "export"
    kind = read_checkpoint(drafter).kind
    export_drafter(drafter, formats_for_kind(kind)[0], export, overwrite=True)  # seconds
    # a block drafter drafts its whole block in the engine (serve-check settles the length)
    default_draft_max = None if get_spec(kind).proposer == "block" else \
        config.eval.decode.num_draft_tokens
    limit = spec.get("limit", config.eval.limit)
    prompts = gather_prompts(config.eval.bench, (), limit)
    settings = ServeCheckSettings(draft_max=spec.get("draft_max", default_draft_max),
                                  max_new_tokens=spec.get("max_new_tokens",
                                                          config.eval.max_new_tokens),
                                  loop=True, engine=engine, device=config.compute_device(),
                                  draft_outtypes=tuple(spec.get("outtypes", ["f32"]))
                                  if engine == "llama.cpp" else ("f32",),
                                  target_outtype=spec.get("target_outtype")
                                  if engine == "llama.cpp" else None)
    log(f"engine check: {spec['drafter']} in {engine}, {len(prompts)} prompts")
    try:
        return run_serve_check(export, config.target, prompts, folder, settings, log=log)
    except DraftsmithError as err:
        if not (folder / RESULT).is_file():  # failed before measuring anything: a real error
            raise
        log(f"engine check recorded as failed: {err}")
        return json.loads((folder / RESULT).read_text())
