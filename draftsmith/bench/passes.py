"""The benchmark's extra evaluation passes (`eval.passes`): each checked as its run will read it."""

from __future__ import annotations

from draftsmith.errors import DraftsmithError

PASS_KEYS = ("methods", "batch_sizes", "target_quant", "check_lossless", "limit", "max_new_tokens",
             "title", "bench", "autotune_tree")
PASS_EXAMPLES = ("{methods: [...], batch_sizes: [1, 2, 4, 8]}, {methods: [...], target_quant: "
                 "[none, int8]}, {methods: [...], check_lossless: true, limit: 3, "
                 "max_new_tokens: 32} or {methods: [...], bench: [sharegpt_long], title: ...}")


def check_pass(name: str, spec) -> None:
    """One `eval.passes` entry, every value checked as its evaluation will read it: known keys, a
    method list, batch sizes >= 1, known quantization schemes, a bool gate, counts >= 1, a title
    (a pass with one gets its own method table in BENCHMARKS.md, speedups against its own plain
    runs), known prompt sets (`bench`, instead of the evaluation's), and `autotune_tree` (a bool:
    the dynamic trees sized for this machine in this pass, e.g. next to a fixed-tree main run).

    Raises:
        DraftsmithError: naming `eval.passes.NAME.KEY`, the value, the choices and an example.
    """
    from draftsmith.eval.prompts.sets import PROMPT_SETS
    from draftsmith.target.quantize import QUANT_SCHEMES

    where = f"eval.passes.{name}"

    def refuse(key: str, problem: str):
        value = spec.get(key) if isinstance(spec, dict) else spec
        raise DraftsmithError(f"{where}{'.' + key if key else ''} = {value!r}: {problem}; map a "
                              f"pass name to {PASS_EXAMPLES}")

    if not isinstance(spec, dict):
        refuse("", "must be a mapping")
    unknown = sorted(set(spec) - set(PASS_KEYS))
    if unknown:
        raise DraftsmithError(f"unknown key(s) {', '.join(f'{where}.{k}' for k in unknown)}; valid "
                              f"keys of a pass: {', '.join(PASS_KEYS)}")
    methods = spec.get("methods")
    if not isinstance(methods, list) or not methods or not all(isinstance(m, str) for m in methods):
        refuse("methods", "list one or more eval methods")
    sizes = spec.get("batch_sizes", [1])
    if not isinstance(sizes, list) or not sizes:
        refuse("batch_sizes", "list one or more batch sizes, integers >= 1, e.g. [1, 2, 4, 8]")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            refuse("batch_sizes", f"{size!r} is not a batch size; list integers >= 1, e.g. "
                   "[1, 2, 4, 8]")
    schemes = spec.get("target_quant", ["none"])
    if not isinstance(schemes, list) or not schemes:
        refuse("target_quant", f"list one or more of: {', '.join(QUANT_SCHEMES)}")
    for scheme in schemes:
        if scheme not in QUANT_SCHEMES:
            refuse("target_quant", f"{scheme!r} is not a quantization scheme; choose from: "
                   f"{', '.join(QUANT_SCHEMES)}")
    for key in ("check_lossless", "autotune_tree"):
        if not isinstance(spec.get(key, False), bool):
            refuse(key, "must be true or false")
    sets = spec.get("bench", list(PROMPT_SETS[:1]))
    if not isinstance(sets, list) or not sets or any(s not in PROMPT_SETS for s in sets):
        refuse("bench", f"list one or more prompt sets of: {', '.join(PROMPT_SETS)}")
    if not isinstance(spec.get("title", ""), str):
        refuse("title", "must be a string: the heading of the pass's own method table")
    for key in ("limit", "max_new_tokens"):
        value = spec.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            refuse(key, "must be an integer >= 1")
