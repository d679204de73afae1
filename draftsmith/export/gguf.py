"""The `gguf` export format: a drafter as the draft GGUF llama.cpp's server loads (`-md
DIR/draft-eagle3.gguf --spec-type draft-eagle3`, likewise `draft-dflash`, `draft-dspark`), its
weights in f32 (exact) or a smaller `--outtype` (f16, bf16, q8_0: the draft's weights cost memory
bandwidth in the engine like the target's).

Here: the target's Hugging Face folder the converter reads (config and tokenizer: the draft GGUF
carries the target's vocabulary) and its sizes checked against the drafter's target; the `gguf`
pseudo-format a model card and the engine table describe; and an export folder staged for
llama.cpp's converter by its format entry's `gguf_stage` (`ExportFormat`, written in the kind's
own export module: layer ids where and how llama.cpp reads them), then converted by
`draftsmith.llama_cpp.convert`, which checks the written `<arch>.target_layers` against the layer
inputs the stage returned. `export_drafter(..., "gguf", ...)` (`write.py`) writes the folder.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.export.record import ExportFormat, ServingSection
from draftsmith.llama_cpp.convert import OUTTYPES, convert_drafter


def target_hf_dir(spec: str | None, given: str | Path | None = None) -> Path:
    """The target's Hugging Face folder the converter reads (config.json and tokenizer).

    Raises:
        DraftsmithError: an offline model not fetched, or a target that is not a local folder
            with no `--target-dir` given.
    """
    from draftsmith.target import offline_models

    if given:
        folder = Path(given)
    elif spec in offline_models.CATALOG:
        if not offline_models.is_fetched(spec):
            raise DraftsmithError(f"the drafter's target {spec} is not fetched: run `draftsmith "
                                  f"models fetch {spec}`")
        folder = offline_models.model_dir(spec)
    else:
        folder = Path(spec or "")
    if not (folder / "config.json").is_file():
        raise DraftsmithError(f"--format gguf needs the target's Hugging Face folder (config.json "
                              f"and tokenizer; the draft GGUF carries the target's vocabulary); "
                              f"{str(given or spec)!r} is not one: pass --target-dir FOLDER "
                              "(e.g. `huggingface-cli download ORG/NAME --local-dir FOLDER`)")
    return folder


# the sizes a draft GGUF shares with its target: the drafter's width, the vocabulary the GGUF
# carries (the target's tokenizer) and the layers its features are read from
TARGET_SIZES = {"hidden_size": "hidden size", "vocab_size": "vocabulary",
                "num_hidden_layers": "layers"}


def target_sizes(config: dict) -> dict[str, int | None]:
    """`TARGET_SIZES` of a transformers config (as a dict), read from its `text_config` where a
    multimodal config keeps them there."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    return {key: config.get(key, text.get(key)) for key in TARGET_SIZES}


def check_target_sizes(meta: dict, hf_dir: Path) -> None:
    """Refuse a target folder whose model differs in size from the one the drafter was trained
    on (recorded as `target_config` in its metadata), before the converter runs.

    Raises:
        DraftsmithError: naming each size that differs, both values, and the folder to pass.
    """
    trained = meta.get("target_config")
    if not isinstance(trained, dict):
        return  # written before drafters recorded their target's config
    try:
        found = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DraftsmithError(f"{hf_dir / 'config.json'} is not readable JSON ({err}); pass "
                              "--target-dir the Hugging Face folder of the drafter's target "
                              f"({meta.get('target')})") from None
    want = target_sizes(trained)
    have = target_sizes(found if isinstance(found, dict) else {})
    differ = [f"{TARGET_SIZES[key]} {_size(have[key])} there but {_size(want[key])} in the "
              "drafter's target" for key in TARGET_SIZES
              if want[key] is not None and have[key] != want[key]]
    if differ:
        raise DraftsmithError(
            f"--target-dir {hf_dir} holds another model than the one the drafter was trained on "
            f"({meta.get('target')}): {'; '.join(differ)}. The draft GGUF carries that folder's "
            "vocabulary and reads that many layers of that width; pass --target-dir the Hugging "
            f"Face folder of {meta.get('target')}, the drafter's own target")


def _size(value) -> str:
    return f"{value:,}" if isinstance(value, int) else "unset"


def _not_a_folder_format(*_args):
    raise DraftsmithError("a gguf export is one file for llama.cpp, not a folder draftsmith reads; "
                          "evaluate the folder export it was made from")


def _gguf_serving(spec_type: str, label_shift: int | None):
    def serving(base: str, drafter: str, settings: dict | None = None) -> list[ServingSection]:
        block = (settings or {}).get("block_size")
        # a block drafter drafts its whole block (DFlash B - 1, DSpark B), EAGLE-3 a chain
        draft_max = block - 1 + (label_shift or 0) if block else 3
        return [ServingSection("llama.cpp", (
            f"llama-server -m TARGET.gguf -md {gguf_name(spec_type)} --spec-type {spec_type} \\",
            f"  --draft-max {draft_max} --draft-min 0 --draft-p-min 0"),
            "`TARGET.gguf` is the target as GGUF. `draftsmith serve-check` runs this pairing "
            "against llama.cpp's plain decoding and draftsmith's own loop.")]
    return serving


def gguf_name(spec_type: str) -> str:
    """The draft file's name: `draft-eagle3.gguf`, `draft-dflash.gguf`, `draft-dspark.gguf`."""
    return f"{spec_type}.gguf"


def gguf_format(kind: str) -> ExportFormat:
    """The `gguf` pseudo-format of a kind llama.cpp serves (for the model card)."""
    from draftsmith.registry import get_spec

    spec = get_spec(kind)
    spec_type = spec.engine_methods["llama.cpp"]
    return ExportFormat("gguf", kind, f"{spec.title} draft GGUF for llama.cpp (`--spec-type "
                        f"{spec_type}`), converted by llama.cpp's own convert_hf_to_gguf.py",
                        _not_a_folder_format, lambda config, names: False, _not_a_folder_format,
                        serving=_gguf_serving(spec_type,
                                              getattr(spec.build, "label_shift", None)),
                        is_folder=False, engines=("llama.cpp",))


def _stage(export_dir: Path, staging: Path) -> tuple[str, list[int]]:
    """A view of the export whose config is what llama.cpp's converter reads (its format entry's
    `gguf_stage`); returns (the export's format name, the layer inputs the GGUF must record).

    Raises:
        DraftsmithError: a layout the converter does not take, or what its `gguf_stage` refuses.
    """
    from draftsmith.export.formats import FORMATS, detect_format
    from draftsmith.export.weights import read_json, tensor_names

    config = read_json(export_dir / "config.json")
    fmt = detect_format(config, tensor_names(export_dir), str(export_dir))
    if fmt.gguf_stage is None:
        takes = [name for name, other in FORMATS.items() if other.gguf_stage is not None]
        raise DraftsmithError(f"{export_dir} is a {fmt.name} export, which llama.cpp's converter "
                              f"does not take; export the drafter as {' / '.join(takes)}, or "
                              "straight to a draft GGUF with `draftsmith export CKPT --format "
                              "gguf`")
    ids = fmt.gguf_stage(config, str(export_dir))
    staging.mkdir(parents=True)
    for item in export_dir.iterdir():
        if item.name != "config.json":
            (staging / item.name).symlink_to(item.resolve())
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    return fmt.name, ids


def convert_to_gguf(export_dir: str | Path, target_hf_dir: str | Path, out: str | Path,
                    log: Callable[[str], None] = print, outtype: str = "f32") -> Path:
    """Convert an export whose format entry has a `gguf_stage` (EAGLE-3 `eagle3` / `speculators`,
    DFlash `dflash` / `dflash-speculators`, DSpark `dspark`) into a llama.cpp draft GGUF.

    Args:
        export_dir: the folder `draftsmith export` wrote.
        target_hf_dir: the target's Hugging Face folder (config.json and tokenizer).
        out: the .gguf file to write (replaced).
        outtype: the converter's weight type, one of `OUTTYPES` (f32 keeps the weights exact).

    Raises:
        DraftsmithError: an unknown outtype, a layout the converter does not take (before the
            converter is fetched), the converter failing (its log's tail quoted) or writing other
            layer ids.
    """
    if outtype not in OUTTYPES:
        raise DraftsmithError(f"--outtype {outtype!r}: choose one of {', '.join(OUTTYPES)}")
    export_dir, out = Path(export_dir), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        staged = Path(scratch) / "export"
        layout, ids = _stage(export_dir, staged)
        return convert_drafter(staged, target_hf_dir, out, ids,
                               f"the {layout} export {export_dir}", log, outtype)
