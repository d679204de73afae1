"""Export trained drafters to the checkpoint layouts serving engines load (EAGLE-3 official /
SGLang and speculators / vLLM, EAGLE-1/2, Medusa, DeepSeek-V3 MTP, DFlash native / speculators,
DSpark DeepSpec; EAGLE-3 and DFlash as llama.cpp draft GGUFs), import those layouts back,
validate them against a target, write model cards and push to the Hugging Face Hub.

Public API:
    export_drafter(ckpt, fmt, out, eval_json=None, options=None, ...) -> Path  (the one entry:
        every folder format, and `gguf` with target_dir / outtype)
    load_exported(folder, target_model, allow_pickle=False) -> LoadedDrafter
    load_any_drafter(folder, target_model) -> LoadedDrafter  (export or draftsmith's own folder)
    is_exported_folder(folder) -> bool
    check_exported(folder, target_config) -> ExportedDrafter
    push_folder(folder, repo_id, private=False, revision=None, dry_run=False) -> commit URL
    convert_to_gguf(export_dir, target_hf_dir, out, outtype="f32") -> Path  (an export folder as
        a llama.cpp draft)
    add_export_parser(subparsers), add_push_parser(subparsers): the CLI verbs

Names are imported on first use, so `draftsmith --help` does not pay for torch and transformers.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "add_export_parser": "cli",
    "add_push_parser": "cli",
    "ExportedDrafter": "record",
    "ExportFormat": "record",
    "ExportOptions": "record",
    "export_drafter": "write",
    "FORMATS": "formats",
    "detect_format": "formats",
    "get_format": "formats",
    "check_exported": "load",
    "convert_to_gguf": "gguf",
    "is_exported_folder": "load",
    "load_any_drafter": "load",
    "load_exported": "load",
    "read_exported": "load",
    "push_folder": "push",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'draftsmith.export' has no attribute {name!r}")
    return getattr(importlib.import_module(f"draftsmith.export.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return __all__
