"""An export folder as a llama.cpp draft GGUF: its config.json staged for llama.cpp's converter
by its format entry's `gguf_stage` (`ExportFormat`, written in the kind's own export module: layer
ids where and how llama.cpp reads them), then converted by `draftsmith.llama_cpp.convert`, which
checks the written `<arch>.target_layers` against the layer inputs the stage returned.
`--outtype` f16 / bf16 / q8_0 shrink the draft (its weights cost memory bandwidth in the engine
like the target's).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.llama_cpp.convert import OUTTYPES, convert_drafter


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
