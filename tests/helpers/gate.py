"""The every-kind lossless gate's inputs on a tiny random target saved as a folder: a random
drafter of every registered kind and of each variant in tests/helpers/drafters.py, the draft model,
a prompt file, and the `draftsmith eval --check-lossless` arguments over all of them. Used by
tests/eval/test_lossless_gate.py on CPU (scripts/gpu_check_fixtures.py holds gpu_check's own copy)."""

from __future__ import annotations

from pathlib import Path

from draftsmith.registry import DRAFTERS
from tests.helpers.drafters import VARIANTS, small_settings
from tests.helpers.export_helpers import build_drafter, write_checkpoint
from tests.helpers.tiny_targets import save_target_and_draft

PROMPTS = "Hi!\nName a colour.\nOk\n"


def every_kind_gate(root: Path) -> tuple[Path, Path, list[str], list[str]]:
    """(root, prompt file, --drafter arguments, methods) with every kind's checkpoint under root."""
    target = save_target_and_draft(root)
    drafter_args, methods = [], ["plain", "prompt_lookup", "draft_model"]
    drafters = [(kind, kind, small_settings(kind)) for kind in DRAFTERS]
    drafters += [(kind, f"{kind}-{name}".replace(".", ""), {**small_settings(kind), **extra})
                 for kind, variants in VARIANTS.items() for name, extra in variants.items()]
    for kind, label, settings in drafters:  # every kind, and each variant (EAGLE-3.1, ...)
        spec = DRAFTERS[kind]
        folder = write_checkpoint(root / label / "drafter", kind,
                                  build_drafter(kind, target, settings), target, settings)
        drafter_args += ["--drafter", f"{label}={folder}"]
        methods += [f"drafter@{label}", f"drafter_lookup@{label}"]
        if "chain" in spec.tree_shapes and spec.default_tree != "chain":
            methods.append(f"drafter_chain@{label}")
    prompts = root / "prompts.txt"
    prompts.write_text(PROMPTS)
    return root, prompts, drafter_args, methods


def gate_args(setup, out, methods=None, extra: tuple[str, ...] = ()) -> list[str]:
    """`draftsmith eval` arguments of the float32 greedy gate at batch sizes 1 and 2."""
    root, prompts, drafter_args, all_methods = setup
    return ["eval", "--target", str(root / "target"), "--draft-model", str(root / "draft"),
            "--prompts", str(prompts), "--max-new-tokens", "10", "--num-draft-tokens", "3",
            "--tree-depth", "3", "--tree-total-tokens", "6", "--batch-size", "1,2",
            "--methods", ",".join(methods or all_methods), *drafter_args, "--check-lossless",
            "--out", str(out), *extra]
