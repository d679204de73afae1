"""`draftsmith serve-check`: an EAGLE-3 or DFlash export run by a real serving engine, checked.

llama.cpp: the export is converted to a draft GGUF with llama.cpp's own converter, then the engine
serves the target's GGUF twice on loopback: plain, and with the draft (`draft-eagle3` /
`draft-dflash`, `draft_max` tokens a step: a DFlash block's block_size - 1). vLLM: the engine
serves the target's Hugging Face folder twice, plain and with `--speculative-config {"method":
"eagle3", "model": EXPORT_DIR, ...}` (the export as written; the method is the kind's in the
registry's `engine_methods`); a process checking several exports serves the plain run once. The same prompts (rendered with the target's chat template, sent as token
ids) are decoded greedily by both runs. The check passes when every speculative answer equals the plain one token for
token and the engine accepts more than `min_acceptance` of the draft tokens; acceptance ~0 in an
engine is the field's common export failure (missing aux layer ids, wrong norms, skipped keys).
An engine's kernels are not bit-identical between a multi-token verify and a one-token step, so
where the two answers part the target's own float32 logits of the two tokens are compared: a gap
of at most `TIE_GAP` logits is a near-tie the kernels flipped (counted and shown, not a failure);
a larger one, or a divergence that cannot be measured, fails the check.
Optionally draftsmith's own loop decodes the same prompts with the same drafter and chain length,
for engine-vs-loop tau and acceptance per draft position.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from draftsmith.engines.engine_requests import (
    EngineAnswer,
    accepted_per_position,
    complete_greedy_openai,
    count_answer,
    metric_total,
    read_metrics,
)
from draftsmith.errors import DraftsmithError
from draftsmith.eval.prompts.sets import BenchPrompt
from draftsmith.eval.settings import DecodeSettings
from draftsmith.llama_cpp.server import DraftOptions, LlamaCppServer, complete_greedy
from draftsmith.serving import ENGINES

DEFAULT_DRAFT_MAX = 3  # a chain drafter's draft length when a caller gives no settings of eval
# the largest float32 logit gap between the two answers' tokens where they part that counts as a
# near-tie: llama.cpp keeps its KV cache in f16 and sums in other orders for several tokens than
# for one, which moves logits by ~1e-2; a verification bug picks a token the target ranks far lower
TIE_GAP = 0.05


@dataclass(frozen=True)
class ServeCheckSettings:
    """What `serve-check` runs.

    Attributes:
        draft_max: draft tokens per engine step (and the chain length of draftsmith's loop); None
            = from `decode`: a block drafter's `block_length` (None: its whole block, DFlash's
            block_size - 1, which llama.cpp's and vLLM's DFlash draft), another drafter's
            `num_draft_tokens`; without `decode`, the whole block or `DEFAULT_DRAFT_MAX`.
        decode: `draftsmith eval`'s decoding settings (the CLI's flags are eval's): they set the
            draft length as above, and draftsmith's loop decodes with them.
        max_new_tokens: greedy tokens per prompt.
        min_acceptance: fail below this engine acceptance rate (accepted / drafted tokens).
        threads: engine CPU threads (None: every core this process may use).
        loop: also decode with draftsmith's own loop for the side-by-side numbers.
        engine: `llama.cpp` or `vllm`.
        device: where the engines and the loop run: `cpu`, `cuda`, `cuda:N` or `auto` (stored
            resolved). On a GPU llama.cpp puts every layer there (`-ngl 999`) and vLLM runs
            without its CPU-only flags; both need a CUDA build of the engine.
        draft_outtypes: llama.cpp only: the draft GGUF's weight types (the converter's
            `--outtype`), one speculative run each after one plain run; the first is the check's
            main run. A smaller draft costs the engine less memory bandwidth per step.
        dtype: vLLM only: its compute dtype, `auto` (what this machine measures faster) or an
            explicit one; `float32` makes ties rare, so plain and speculative outputs compare
            token for token (in bf16 near-tied logits can rank differently in a multi-token
            verify). llama.cpp computes in the GGUFs' own types.
        target_outtype: llama.cpp only: serve the target's folder converted to a GGUF of this
            type (f32: the weights the float32 loop decodes) instead of its GGUF file.
    """

    draft_max: int | None = None
    decode: DecodeSettings | None = None
    max_new_tokens: int = 128
    min_acceptance: float = 0.05
    threads: int | None = None
    loop: bool = False
    engine: str = "llama.cpp"
    device: str = "cpu"
    draft_outtypes: tuple[str, ...] = ("f32",)
    dtype: str = "auto"
    target_outtype: str | None = None

    def __post_init__(self):
        from draftsmith.llama_cpp.convert import OUTTYPES
        from draftsmith.target.load import resolve_device
        from draftsmith.target.precision import check_dtype

        types = tuple(self.draft_outtypes)
        if not types or len(set(types)) < len(types) or set(types) - set(OUTTYPES):
            raise DraftsmithError(f"--draft-outtype {','.join(types)}: give distinct types among "
                                  f"{', '.join(OUTTYPES)}, e.g. f32,f16,q8_0")
        if types != ("f32",) and self.engine != "llama.cpp":
            raise DraftsmithError("--draft-outtype is for llama.cpp (the draft's GGUF weights); "
                                  f"{self.engine} serves the export as written")
        object.__setattr__(self, "draft_outtypes", types)
        check_dtype(self.dtype)
        if self.dtype != "auto" and self.engine != "vllm":
            raise DraftsmithError(f"--dtype {self.dtype} is for vLLM; llama.cpp computes in the "
                                  "GGUFs' own types (the draft's: --draft-outtype)")

        object.__setattr__(self, "device", str(resolve_device(self.device, "--device")))
        if self.engine not in ENGINES:
            raise DraftsmithError(f"--engine {self.engine}: choose {', '.join(ENGINES)}")
        if self.draft_max is not None and self.draft_max < 1:
            raise DraftsmithError(f"--draft-max {self.draft_max} must be >= 1")
        if self.max_new_tokens < 1:
            raise DraftsmithError(f"--max-new-tokens {self.max_new_tokens} must be >= 1")
        if not 0.0 <= self.min_acceptance <= 1.0:
            raise DraftsmithError(f"--min-acceptance {self.min_acceptance} must be in [0, 1]")

    def loop_decode(self) -> DecodeSettings:
        """The settings draftsmith's loop decodes with: `decode`, its chain the engine's draft
        length (`draft_max`, once settled)."""
        return replace(self.decode or DecodeSettings(), num_draft_tokens=self.draft_max)


@dataclass
class EngineRun:
    """One pass of the engine over every prompt."""

    answers: list[EngineAnswer]
    metrics: dict[str, float]
    reused_from: str | None = None  # the log of the plain run this one reuses (`run_vllm`)

    @property
    def tokens_per_second(self) -> float:
        tokens = sum(len(a.tokens) for a in self.answers)
        seconds = sum(a.predicted_ms for a in self.answers) / 1000
        return tokens / seconds if seconds > 0 else 0.0


def _context(prompts: list[list[int]], settings: ServeCheckSettings) -> int:
    return max(len(p) for p in prompts) + settings.max_new_tokens + (settings.draft_max or 0) + 8


def run_engine(gguf: Path, prompts: list[list[int]], settings: ServeCheckSettings, log_path: Path,
               draft: DraftOptions | None = None, log: Callable[[str], None] = print) -> EngineRun:
    """Greedy answers to every prompt from one llama.cpp server (one slot, requests in turn)."""
    with LlamaCppServer(gguf, parallel=1, ctx_per_slot=_context(prompts, settings),
                        threads=settings.threads, log_path=log_path, log=log, draft=draft,
                        metrics=True, device=settings.device) as server:
        answers, before = [], read_metrics(server.root_url)
        try:
            for ids in prompts:
                answer = complete_greedy(server.root_url, ids, settings.max_new_tokens)
                after = read_metrics(server.root_url)
                if draft is not None:
                    count_answer(answer, before, after, draft.draft_max, "llamacpp")
                answers.append(answer)
                before = after
        except DraftsmithError as err:
            raise engine_abort(err, log_path, gguf, draft) from None
        return EngineRun(answers, before)


LAYER_INPUTS_MISSING = "layer input tensor is null"


def engine_abort(err: DraftsmithError, log_path: Path, gguf: Path,
                 draft: DraftOptions | None) -> DraftsmithError:
    """The error of a llama.cpp server that died on a request: its own assertion from the log
    where it wrote one, and what it means where it is known. llama.cpp's EAGLE-3 and DFlash
    drafts read the target's layer inputs, which only some of its model graphs expose (its qwen2
    graph in xllamacpp 2026.10.11549 does not: the first drafted request aborts)."""
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    asserts = [line.strip() for line in text.splitlines() if "GGML_ASSERT" in line]
    if not asserts:
        return err
    message = f"llama.cpp aborted serving {gguf.name}: {asserts[0]} (log: {log_path})"
    if LAYER_INPUTS_MISSING in asserts[0] and draft is not None:
        from draftsmith.llama_cpp.convert import gguf_fields

        arch = gguf_fields(gguf).get("general.architecture", "this target's")
        message += (f". This llama.cpp build's `{arch}` graph does not expose the layer inputs a "
                    f"{draft.spec_type} draft reads, so it cannot serve this drafter against "
                    "this target (its llama graph, SmolLM2's, does). Serve it in vLLM instead "
                    "(`--engine vllm`), or check a drafter for a target whose graph exposes them")
    return DraftsmithError(message)


# vLLM's plain runs in this process: (target files, prompts, settings) -> (run, its log). Checking
# several exports against one target (the vLLM gate, the benchmark's engine stage) starts the plain
# server once, not once per export (about 50 s each on a 2-core CPU).
_PLAIN_RUNS: dict[tuple, tuple[EngineRun, Path]] = {}


def _files_key(folder: Path) -> tuple:
    """The folder and each file's name, size and modification time: a rewritten target is new."""
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return (str(folder.resolve()), *((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files))


def run_vllm(target_dir: Path, prompts: list[list[int]], settings: ServeCheckSettings,
             log_path: Path, speculative: dict | None = None,
             log: Callable[[str], None] = print, dtype: str = "float32") -> EngineRun:
    """Greedy answers to every prompt from one vLLM server (one sequence at a time); each
    answer's drafted and accepted tokens are the spec-decode counters' change over its request.
    A plain run (no `speculative`) this process already made of the same target, prompts and
    settings is reused; its log file then names the first run's log."""
    from draftsmith.engines.vllm import VllmServer

    key = None
    if speculative is None:
        # the engine: the Python `$DRAFTSMITH_VLLM_PYTHON` names, or draftsmith's own install
        key = (os.environ.get("DRAFTSMITH_VLLM_PYTHON", ""), _files_key(Path(target_dir)),
               tuple(map(tuple, prompts)),
               settings.max_new_tokens, _context(prompts, settings), settings.threads,
               settings.device, dtype)
        if key in _PLAIN_RUNS:
            run, first_log = _PLAIN_RUNS[key]
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            Path(log_path).write_text(f"the plain run of {first_log}, reused: this process served "
                                      "the same target, prompts and settings before\n")
            log(f"vLLM plain run: reused this process's run of the same target and prompts "
                f"(log: {first_log})")
            return replace(copy.deepcopy(run), reused_from=str(first_log))
    drafted, accepted = (f"vllm:spec_decode_num_{k}_tokens_total" for k in ("draft", "accepted"))
    with VllmServer(target_dir, speculative=speculative, max_model_len=_context(prompts, settings),
                    dtype=dtype, threads=settings.threads, log_path=log_path, log=log,
                    device=settings.device) as server:
        answers, before = [], read_metrics(server.root_url)
        for ids in prompts:
            answer = complete_greedy_openai(server.base_url, server.served_name, ids,
                                            settings.max_new_tokens)
            after = read_metrics(server.root_url)
            answer.draft_n = round(metric_total(after, drafted) - metric_total(before, drafted))
            answer.draft_accepted = round(metric_total(after, accepted)
                                          - metric_total(before, accepted))
            if speculative:
                count_answer(answer, before, after, speculative["num_speculative_tokens"],
                             "vllm")
            answers.append(answer)
            before = after
    run = EngineRun(answers, before)
    if key is not None:
        _PLAIN_RUNS[key] = (copy.deepcopy(run), Path(log_path))
    return run


def engine_acceptance(run: EngineRun, draft_max: int, prefix: str = "llamacpp") -> dict:
    """tau, acceptance rate and acceptance per draft position from the engine's own counters
    (`prefix`: the engine's metric prefix, `llamacpp` or `vllm`)."""
    drafted = sum(a.draft_n for a in run.answers)
    accepted = sum(a.draft_accepted for a in run.answers)
    tokens = sum(len(a.tokens) for a in run.answers)
    steps = sum(a.target_steps for a in run.answers)
    drafts = metric_total(run.metrics, f"{prefix}:spec_decode_num_drafts_total")
    per_position = [round(n / drafts, 4) if drafts else 0.0
                    for n in accepted_per_position(run.metrics, draft_max, prefix)]
    return {"tau": round(tokens / max(steps, 1), 4),
            "acceptance": round(accepted / drafted, 4) if drafted else 0.0,
            "draft_tokens": drafted, "accepted_tokens": accepted, "drafts": int(drafts),
            "acceptance_per_position": per_position}


def first_difference(plain: list[int], spec: list[int]) -> int | None:
    """Index of the first differing token (the shorter length when one is a prefix), or None."""
    for i, (a, b) in enumerate(zip(plain, spec, strict=False)):
        if a != b:
            return i
    return None if len(plain) == len(spec) else min(len(plain), len(spec))


def prompt_token_ids(tokenizer, prompts: list[BenchPrompt]) -> list[list[int]]:
    """Each prompt's first turn in the target's chat template."""
    from draftsmith.target.chat import render_chat

    return [render_chat(tokenizer, [{"role": "user", "content": p.turns[0]}]) for p in prompts]


def compare_outputs(prompts: list[BenchPrompt], plain: EngineRun, spec: EngineRun) -> list[dict]:
    """One record per prompt: lengths, whether the answers are identical and where they differ."""
    records = []
    for n, (prompt, a, b) in enumerate(zip(prompts, plain.answers, spec.answers, strict=True)):
        diff = first_difference(a.tokens, b.tokens)
        record = {"set": prompt.set_name, "id": prompt.item_id, "prompt_index": n,
                  "new_tokens": len(b.tokens),
                  "identical": diff is None, "first_difference": diff, "draft_n": b.draft_n,
                  "draft_accepted": b.draft_accepted}
        if diff is not None and diff < min(len(a.tokens), len(b.tokens)):
            record.update(plain_token=a.tokens[diff], spec_token=b.tokens[diff])
        records.append(record)
    return records


def is_near_tie(record: dict) -> bool:
    """A divergence where the target's float32 logits of the two tokens are within `TIE_GAP`."""
    gap = record.get("tie_gap")
    return not record["identical"] and gap is not None and gap <= TIE_GAP


def near_tie_note(records: list[dict]) -> str:
    """`` (2 part at near-ties: the target's float32 logit gaps 0.003, 0.012 <= 0.05)`` or ''."""
    gaps = [r["tie_gap"] for r in records if is_near_tie(r)]
    if not gaps:
        return ""
    return (f" ({len(gaps)} part at near-ties: the target's float32 logit gap"
            f"{'s' if len(gaps) > 1 else ''} {', '.join(f'{g:.3g}' for g in gaps)} <= {TIE_GAP})")


def real_divergences(records: list[dict]) -> list[dict]:
    """The records whose answers differ beyond a near-tie."""
    return [r for r in records if not r["identical"] and not is_near_tie(r)]


def failures(summary: dict, settings: ServeCheckSettings) -> list[str]:
    """What makes the check fail, in words that say where to look."""
    problems = []
    for outtype, run in (summary.get("draft_types") or {}).items():
        bad = real_divergences(run.get("differing", []))
        if bad:
            problems.append(f"with the {outtype} draft GGUF, greedy outputs differ from plain "
                            f"decoding in the engine on {len(bad)} of {run['identical'][1]} "
                            f"prompts beyond a near-tie")
    total = summary["identical"][1]
    bad = real_divergences(summary["records"])
    if bad:
        first = bad[0]
        gap = (f", the target's float32 logit gap {first['tie_gap']} > {TIE_GAP}"
               if first.get("tie_gap") is not None else "")
        problems.append(f"greedy outputs differ from plain decoding in the engine on {len(bad)} "
                        f"of {total} prompts beyond a near-tie (first: {first['set']}/"
                        f"{first['id']} at new token {first['first_difference']}{gap}); "
                        "speculation must not change greedy output")
    engine = summary["engine_stats"]
    rate = engine["acceptance"]
    if rate < settings.min_acceptance:
        said = (f"the engine accepted {engine['accepted_tokens']} of {engine['draft_tokens']} "
                f"draft tokens ({rate:.1%} < --min-acceptance {settings.min_acceptance:.0%})")
        loop = (summary.get("draftsmith") or {}).get("acceptance")
        if loop is not None and loop > 0 and rate >= 0.5 * loop:
            problems.append(f"{said}, and draftsmith's own loop accepted {loop:.1%} on the same "
                            "prompts: the export and the engine agree, the drafter itself "
                            "drafts too poorly to pay (train it longer or on more data)")
        else:
            problems.append(
                f"{said}: the export and the engine disagree. Usual causes: aux layer ids "
                "missing or shifted, wrong norms, skipped keys, a draft vocabulary mapping (d2t) "
                "lost; an untrained drafter also accepts nothing")
    return problems


def print_table(summary: dict, log: Callable[[str], None] = print) -> None:
    """The check's table: the engine's numbers next to draftsmith's loop's (`--loop`)."""
    engine, loop = summary["engine_stats"], summary.get("draftsmith")
    same, total = summary["identical"]
    from draftsmith.registry import get_spec

    title = get_spec(summary.get("kind", "eagle3")).title
    log(f"serve-check {summary['engine']} {summary['version']}: {summary['target']}, "
        f"{title} x {summary['draft_max']}, {total} prompts x {summary['max_new_tokens']} tokens")
    rows = [("identical greedy outputs", f"{same}/{total}", ""),
            ("tau (tokens per target step)", f"{engine['tau']:.2f}",
             f"{loop['tau']:.2f}" if loop else "-"),
            ("acceptance rate", f"{engine['acceptance']:.1%}",
             f"{loop['acceptance']:.1%}" if loop else "-")]
    for k, rate in enumerate(engine["acceptance_per_position"]):
        rows.append((f"  accepted at draft position {k + 1}", f"{rate:.1%}",
                     f"{loop['acceptance_per_position'][k]:.1%}" if loop else "-"))
    rows += [("tokens/s with the draft", f"{engine['tokens_per_second_spec']:.1f}",
              f"{loop['tokens_per_second']:.1f} (fp32)" if loop else "-"),
             ("tokens/s plain", f"{engine['tokens_per_second_plain']:.1f}", ""),
             ("speedup over the engine's plain decoding", f"{engine['speedup']:.2f}x", "")]
    if loop:  # a quantized engine target may answer otherwise: then the columns see other text
        rows.append(("answers equal to the engine's", "", "{}/{}".format(
            *loop["same_answer_as_engine"])))
    log(f"{'':44} {'engine':>10} {'draftsmith loop':>18}")
    for name, a, b in rows:
        log(f"{name:44} {a:>10} {b:>18}")
    for outtype, run in (summary.get("draft_types") or {}).items():
        log(f"draft GGUF {outtype:5} ({run['draft_gguf_bytes'] / 1e6:.1f} MB): "
            f"{run['tokens_per_second_spec']:.1f} tokens/s, {run['speedup']:.2f}x plain, "
            f"acceptance {run['acceptance']:.1%}, identical {run['identical'][0]}/"
            f"{run['identical'][1]}{near_tie_note(run.get('differing', []))}")
    note = near_tie_note(summary["records"])
    if note:
        log(f"greedy outputs with the draft: {same}/{total} identical{note}")
