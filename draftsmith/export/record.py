"""What every export format produces and reads: the options of an export, a drafter read back
from an export folder in draftsmith's own terms, and the description of one format."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.export.source import DraftsmithCheckpoint


@dataclass(frozen=True)
class ExportOptions:
    """Choices that apply to every format.

    Attributes:
        base_model: Hub id of the target written into configs and the card; None = derived from
            the training target (offline names map to their upstream Hub id).
        dtype: cast floating tensors to `float32` / `bfloat16` / `float16`; None keeps them.
        skip_frozen: leave out the frozen copies of the target's embedding and head; engines and
            `load_exported` take them from the target instead (smaller upload).
        include_frozen: `dflash` / `dflash-speculators`: also write those copies, which these
            layouts leave out by default (z-lab, SpecForge and speculators ship none; vLLM
            accepts them).
        allow_base_model_mismatch: accept a `base_model` Hub id other than the one the drafter
            was trained for (e.g. a quantized re-upload of it); its sizes are still checked.
    """

    base_model: str | None = None
    dtype: str | None = None
    skip_frozen: bool = False
    include_frozen: bool = False
    allow_base_model_mismatch: bool = False


@dataclass
class ExportedDrafter:
    """A drafter read from an export folder, renamed into draftsmith's module names.

    Attributes:
        format: export format name (see `FORMATS`).
        kind: draftsmith drafter kind it loads into.
        settings: fields of the kind's config dataclass (for `spec.make_config`).
        state: tensors under the names of the draftsmith module; frozen copies may be absent.
        hidden_size, vocab_size: what the drafter was built for (vocab None when not recorded).
        draft_vocab_size: EAGLE-3 only.
        aux_layer_ids: kinds that fuse target layers (EAGLE-3, DFlash, DSpark): the 0-based
            target layer outputs it fuses ([] = not recorded: the default for the target is
            assumed).
        mtp_first_layer: MTP only: the layer number of the first module in the file (N for the
            DeepSeek-V3 layout, 0 for SGLang's renumbered NextN layout).
        base_model: target the export names, if any.
    """

    format: str
    kind: str
    settings: dict
    state: dict[str, torch.Tensor]
    hidden_size: int
    vocab_size: int | None
    draft_vocab_size: int | None = None
    aux_layer_ids: list[int] = field(default_factory=list)
    mtp_first_layer: int | None = None
    base_model: str | None = None


@dataclass(frozen=True)
class ServingSection:
    """How one engine serves an export, for its model card: a command, or a note saying why
    not from this folder (and what to export instead).

    Attributes:
        engine: the engine's name as a heading.
        command: shell lines (DRAFTER stands for the export's folder or Hub repo).
        note: text instead of, or after, the command.
    """

    engine: str
    command: tuple[str, ...] = ()
    note: str = ""


def vllm_command(base: str, drafter: str, method: str, tokens: int) -> ServingSection:
    """vLLM serving `base` with a drafter under `--speculative-config` method `method`."""
    return ServingSection("vLLM", (
        f"vllm serve {base} --speculative-config \\",
        f"  '{{\"method\": \"{method}\", \"model\": \"{drafter}\", "
        f"\"num_speculative_tokens\": {tokens}}}'"))


def sglang_command(base: str, drafter: str, algorithm: str) -> ServingSection:
    """SGLang serving `base` with a drafter under `--speculative-algorithm algorithm`."""
    return ServingSection("SGLang", (
        f"python -m sglang.launch_server --model-path {base} \\",
        f"  --speculative-algorithm {algorithm} --speculative-draft-model-path {drafter} \\",
        "  --speculative-num-steps 5 --speculative-eagle-topk 8 "
        "--speculative-num-draft-tokens 32"))


def no_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    return []


@dataclass(frozen=True)
class ExportFormat:
    """One checkpoint layout, with everything that differs between layouts.

    Attributes:
        name: `--format` value.
        kind: the draftsmith drafter kind it holds.
        description: one line for `--help`.
        write: (checkpoint, out folder, options) -> config dict written to `config.json`; also
            writes the safetensors weights next to it.
        matches: (config.json dict, tensor names) -> True when a folder is in this format.
        read: (config.json dict, tensors, folder name for messages) -> ExportedDrafter.
        config_keys: (drafter read back, config.json) -> (key, value or MISSING, implied value)
            of every key its engines read (`export/config_keys.py`); checked on write and load.
        serving: (base model, drafter folder, the drafter's recorded settings) -> the engines'
            sections of its model card (block drafters name their block size in the commands).
        library_name: the model card's `library_name` (what the Hub shows as its loader).
        is_folder: a folder layout with config.json (False: one converted file, e.g. GGUF).
        engines: the serving engines (registry names: `vllm`, `sglang`, `llama.cpp`) that load
            this layout as written (`export/engine_support.py` builds the support table).
        not_served_in: `"ENGINE VERSION"` -> why that version does not serve it (vLLM 0.33
            removed Medusa).
        gguf_stage: (config.json dict, folder name for messages) -> the target layers (layer
            inputs) the draft GGUF must record, after rewriting the dict in place into what
            llama.cpp's `convert_hf_to_gguf.py` reads from this layout; None: llama.cpp's
            converter does not take this layout. The kind's first format with one is the layout
            `--format gguf` exports and converts (`formats.gguf_source_format`).
    """

    name: str
    kind: str
    description: str
    write: Callable[[DraftsmithCheckpoint, Path, ExportOptions], dict]
    matches: Callable[[dict, set[str]], bool]
    read: Callable[[dict, dict[str, torch.Tensor], str], ExportedDrafter]
    config_keys: Callable[[ExportedDrafter, dict], list] = no_config_keys
    serving: Callable[[str, str, dict], list[ServingSection]] = lambda base, drafter, settings: []
    library_name: str = "draftsmith"
    is_folder: bool = True
    engines: tuple[str, ...] = ()
    not_served_in: dict[str, str] = field(default_factory=dict)
    gguf_stage: Callable[[dict, str], list[int]] | None = None
