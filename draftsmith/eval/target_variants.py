"""Speculation over a quantized target, side by side with the target as loaded
(`draftsmith eval --target-quant none,int8wo`).

Each quantized copy (draftsmith/target/quantize.py) gets its own `MethodExecutor`: every method runs on
every prompt turn right after it ran on the target as loaded, with the same drafters, trees and
prompts (MT-bench's second turn follows the first target's plain answer for every variant). The
drafters are unchanged; what changes is the model that verifies: its logits decide the tokens and
hidden-state drafters (EAGLE, Medusa, MTP) read its hidden states, so a variant's output is the
quantized model's, not the float target's (with weight-only int8 as exactly as over the float
target; with dynamic int8 not bit-identical to that model's one-token decoding: see
draftsmith/target/quantize.py). Speedups are against
plain decoding of the same variant; the acceptance drop is against the target as loaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.eval.executor import MethodExecutor
from draftsmith.eval.lossless import first_divergence
from draftsmith.eval.methods import Method
from draftsmith.eval.metrics import RunRecord, summarize_all
from draftsmith.target import offline_models
from draftsmith.target.load import Target
from draftsmith.target.quantize import quantize_model, verified_output


def loaded_precision(target: Target) -> str:
    """What the target as loaded is, in words: its dtype, and the GGUF it was dequantized from."""
    dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
    gguf = None
    if target.spec in offline_models.CATALOG:
        gguf = offline_models.CATALOG[target.spec].gguf_name
    elif Path(target.spec).suffix == ".gguf":
        gguf = Path(target.spec).name
    if gguf:
        kind = Path(gguf).stem.rsplit(".", 1)[-1]
        return (f"{dtype} weights dequantized by transformers from the GGUF {gguf} ({kind}): "
                f"full precision here means {kind}'s values held in {dtype}")
    return f"{dtype} weights as loaded"


@dataclass
class TargetVariant:
    """One quantized copy of the target with its executor and what ran on it."""

    name: str
    executor: MethodExecutor
    quantization: dict
    records: list[RunRecord] = field(default_factory=list)
    identical: dict[str, list[int]] = field(default_factory=dict)  # method -> [same, count]
    divergent: dict[str, dict] = field(default_factory=dict)  # method -> first divergence


class TargetVariants:
    """The quantized variants of a run (none when `--target-quant none`)."""

    def __init__(self, base: MethodExecutor, log=print):
        config = base.config
        self.base = base
        self.variants: list[TargetVariant] = []
        for scheme in config.target_quant[1:]:
            self.variants.append(self._build(base, scheme, log))

    @staticmethod
    def _build(base: MethodExecutor, scheme: str, log) -> TargetVariant:
        target = base.target
        copied = quantize_model(target.model, scheme)
        quantized = Target(copied.model, target.tokenizer, target.spec, target.dtype_choice)
        drafters = {}
        for label, (drafter, model) in base.drafters.items():
            own = copied.model if model is target.model else quantize_model(model, scheme).model
            drafters[label] = (drafter, own)
        executor = MethodExecutor(base.config, quantized, base.draft_model, drafters)
        executor.settings = base.settings  # the same (autotuned) trees on every variant
        executor.chat_template = base.chat_template
        info = copied.info
        log(f"target {scheme}: {info['quantized_linears']} linears quantized "
            f"({info['method']}), kept float: "
            f"{', '.join(info['float_linears']) or 'none'}; weights "
            f"{info['weight_bytes_before'] / 2**20:.0f} -> {info['weight_bytes_after'] / 2**20:.0f}"
            f" MiB. Its methods verify with this copy: their output is the {scheme} model's")
        return TargetVariant(scheme, executor, info,
                             identical={m: [0, 0] for m in base.config.methods[1:]})

    def __len__(self) -> int:
        return len(self.variants)

    def warm(self, prompt_ids: list[int]) -> None:
        """First calls pay one-time costs; keep them out of the numbers."""
        for variant in self.variants:
            for method in self.base.config.methods:
                variant.executor.run(method, prompt_ids, 8)

    def run_turn(self, prompt_ids: list[int], item, turn: int, progress=None) -> None:
        """Every method on every variant for one prompt turn, compared with that variant's plain."""
        config = self.base.config
        tokenizer = self.base.target.tokenizer
        for variant in self.variants:
            reference = None
            for method in config.methods:
                if progress is not None:
                    progress.set_postfix_str(f"{item.set_name}/{item.item_id} {method} "
                                             f"[{variant.name}]")
                tokens, record = variant.executor.run(method, prompt_ids, config.max_new_tokens,
                                                      item.set_name, item.item_id, turn)
                variant.records.append(record)
                if reference is None:
                    reference = tokens
                else:
                    counts = variant.identical[method]
                    counts[0] += tokens == reference
                    counts[1] += 1
                    if tokens != reference and method not in variant.divergent:
                        variant.divergent[method] = first_divergence(
                            tokenizer, reference, tokens, item, turn)
                if progress is not None:
                    progress.update()

    def _checked(self, variant: TargetVariant) -> list[str]:
        """Methods whose output must equal the variant's plain decoding: all but Medusa-2 ones
        (they decode with a quantized copy of their merged target, another model by design)."""
        merged = {label for label, (d, _) in self.base.drafters.items() if d.meta.get("lora")}
        return [m for m in self.base.config.methods[1:]
                if not ((p := Method.parse(m)).uses_drafter and p.label in merged)]

    def extend_lossless(self, check: dict) -> dict:
        """Add each variant's greedy comparisons to the run's `lossless_check` (in place).

        Only a row-independent copy (`int8wo`) is gated: dynamic int8 computes one activation
        scale over all rows of a forward, so its multi-token verify can differ from its own
        one-token decoding by design; it is listed under `not_gated` with that reason and its
        `identical_to_plain` says how often its output still matched."""
        if not check.get("greedy"):
            return check
        for variant in self.variants:
            if not variant.quantization.get("row_independent", True):
                check.setdefault("not_gated", {})[f"{variant.name} target"] = (
                    "its activation scales are computed per forward over all rows, so a "
                    "multi-token verify can differ from its one-token decoding by design "
                    "(identical_to_plain reports how often outputs matched)")
                continue
            for method in self._checked(variant):
                name = f"{method} ({variant.name} target)"
                check["checked"].append(name)
                if method in variant.divergent:
                    check["failures"].append({"method": name, **variant.divergent[method]})
        return check

    def report(self, table: dict) -> dict:
        """eval.json's `target_variants`: per variant the verified output's precision, the
        quantization, and a summary like the run's (speedup against the variant's own plain
        decoding) with the drop against the target as loaded."""
        target = self.base.target
        baseline = self.base.config.methods[0]
        loaded = loaded_precision(target)
        out = {"none": {"quantization": None, "verified_output": f"the target as loaded: {loaded}",
                        "summary": table}}
        for variant in self.variants:
            summary = summarize_all(variant.records, baseline=baseline)
            for set_name, methods in summary.items():
                full = table.get(set_name, {})
                for method, row in methods.items():
                    _add_drops(row, full.get(method), full.get(baseline))
                    same, count = variant.identical.get(method, (0, 0))
                    if count:
                        row["identical_to_plain"] = same / count
            out[variant.name] = {
                "quantization": variant.quantization,
                "verified_output": verified_output(variant.name, variant.quantization, loaded),
                "summary": summary,
                "records": [r.to_dict() for r in variant.records],
            }
        return out


def _add_drops(row: dict, full: dict | None, full_plain: dict | None) -> None:
    """Acceptance and tau drop against the same method on the target as loaded (positive = the
    quantized target accepts less), and tokens/s against the loaded target's plain decoding."""
    row["tau_drop"] = (full["tau"] - row["tau"]
                       if full and full.get("tau") is not None and row.get("tau") is not None
                       else None)
    mine = row.get("acceptance_by_depth") or []
    theirs = (full or {}).get("acceptance_by_depth") or []
    row["acceptance_drop_by_depth"] = [
        None if math.isnan(a) or math.isnan(b) else b - a
        for a, b in zip(mine, theirs, strict=False)]
    plain_tps = (full_plain or {}).get("tokens_per_second")
    row["speedup_vs_loaded_plain"] = (row["tokens_per_second"] / plain_tps
                                      if plain_tps else None)

