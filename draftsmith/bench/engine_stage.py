"""The benchmark's engine stage: the trained EAGLE-3 drafter exported, converted to a draft GGUF
and run by llama.cpp's server next to draftsmith's own loop (`draftsmith serve-check --loop`), on
the benchmark's prompts (first turns), so BENCHMARKS.md has the engine-vs-loop table.

Layout under `out_dir/engine/`: `export/` (the `eagle3` export), `draft.gguf`, the engine logs and
`serve_check.json`. Skipped when `serve_check.json` exists. A check that fails (outputs differ,
acceptance ~0) is recorded with `passed: false` and reported; it does not stop the benchmark.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.bench.config import BenchConfig
from draftsmith.errors import DraftsmithError

RESULT = "serve_check.json"


def engine_check(config: BenchConfig, log=print) -> dict | None:
    """Run (or read) the engine check of `config.engine`; None when the config asks for none."""
    from draftsmith.data.prompts import gather_prompts
    from draftsmith.export.write import export_drafter
    from draftsmith.serving.serve_check import ServeCheckSettings
    from draftsmith.serving.serve_check_run import run_serve_check

    spec = config.engine
    if not spec:
        return None
    folder = Path(config.out_dir) / "engine"
    if (folder / RESULT).is_file():
        return json.loads((folder / RESULT).read_text())
    drafter = Path(config.out_dir) / "train" / spec["drafter"] / "drafter"
    export = export_drafter(drafter, "eagle3", folder / "export", overwrite=True)
    limit = spec.get("limit", config.eval.limit)
    prompts = gather_prompts(config.eval.bench, (), limit)
    settings = ServeCheckSettings(draft_max=spec.get("draft_max", config.eval.num_draft_tokens),
                                  max_new_tokens=spec.get("max_new_tokens",
                                                          config.eval.max_new_tokens),
                                  loop=True)
    log(f"engine check: {spec['drafter']} in llama.cpp, {len(prompts)} prompts")
    try:
        return run_serve_check(export, config.target, prompts, folder, settings, log=log)
    except DraftsmithError as err:
        if not (folder / RESULT).is_file():  # failed before measuring anything: a real error
            raise
        log(f"engine check recorded as failed: {err}")
        return json.loads((folder / RESULT).read_text())
