"""`draftsmith export CKPT --format gguf --out DIR`: an EAGLE-3, DFlash or DSpark drafter as the
draft GGUF that llama.cpp's server loads (`-md DIR/draft-eagle3.gguf --spec-type draft-eagle3`,
`-md DIR/draft-dflash.gguf --spec-type draft-dflash`, `-md DIR/draft-dspark.gguf --spec-type
draft-dspark`), its weights in f32 (exact) or a smaller `--outtype` (f16, bf16, q8_0).

The drafter is first exported in the `eagle3` / `dflash` / `dspark` layout (read back and compared tensor by
tensor, as every export), then converted by llama.cpp's own `convert_hf_to_gguf.py` of the
engine's pinned version (`export/gguf.py`), which also needs the target's Hugging Face folder
(config and tokenizer: the draft GGUF carries the target's vocabulary). DIR holds the GGUF, the
training metadata and a model card with the llama-server command; it is written to
`DIR.partial` and renamed when complete.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from draftsmith.drafter_folder import DRAFTER_CONFIG
from draftsmith.errors import DraftsmithError
from draftsmith.export.gguf_format import gguf_format, gguf_name
from draftsmith.export.record import ExportOptions
from draftsmith.files import write_json


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


def export_gguf(checkpoint: str | Path, out: str | Path, eval_json: str | Path | None = None,
                options: ExportOptions | None = None, overwrite: bool = False,
                target_dir: str | Path | None = None,
                log: Callable[[str], None] = print, outtype: str = "f32") -> Path:
    """Write `out/draft-eagle3.gguf`, `out/draft-dflash.gguf` or `out/draft-dspark.gguf` (weights
    as `outtype`: f32, f16, bf16 or q8_0), `draftsmith_drafter.json` and a model card.

    Raises:
        DraftsmithError: a drafter llama.cpp does not serve, an existing output, no target
            folder or one of another model (`check_target_sizes`), an unknown outtype, or the
            converter failing (its log's tail quoted).
    """
    from draftsmith.export.card import model_card, read_eval
    from draftsmith.export.folder_export import export_folder
    from draftsmith.export.formats import formats_for_kind, gguf_source_format
    from draftsmith.export.gguf import convert_to_gguf
    from draftsmith.export.out_folder import (
        CARD,
        check_base_model,
        check_out_folder,
        partial_folder,
    )
    from draftsmith.export.source import base_model_id, read_checkpoint
    from draftsmith.llama_cpp.convert import OUTTYPES
    from draftsmith.registry import get_spec, served_by

    options = options or ExportOptions()
    ckpt = read_checkpoint(checkpoint)
    if "llama.cpp" not in get_spec(ckpt.kind).engine_methods:
        raise DraftsmithError(f"--format gguf holds {' / '.join(served_by('llama.cpp'))} drafters "
                              f"(those llama.cpp serves) but {ckpt.folder} is a {ckpt.kind} "
                              "drafter; use --format "
                              f"{' or '.join(formats_for_kind(ckpt.kind))}")
    spec = get_spec(ckpt.kind)
    unserved = spec.unserved_by(spec.make_config(ckpt.meta.get("drafter_config") or {}))
    if "llama.cpp" in unserved:
        raise DraftsmithError(f"--format gguf: {ckpt.folder}: {unserved['llama.cpp']}")
    if outtype not in OUTTYPES:
        raise DraftsmithError(f"--outtype {outtype!r}: choose one of {', '.join(OUTTYPES)}")
    name = gguf_name(spec.engine_methods["llama.cpp"])
    out = Path(out)
    check_out_folder(out, overwrite, source=ckpt.folder)
    if options.base_model:
        check_base_model(options.base_model, ckpt, options.allow_base_model_mismatch)
    eval_payload = read_eval(eval_json, ckpt.meta) if eval_json else None
    hf_dir = target_hf_dir(ckpt.meta.get("target"), target_dir)
    check_target_sizes(ckpt.meta, hf_dir)
    tmp = partial_folder(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=tmp.parent) as scratch:
        staged = export_folder(checkpoint, gguf_source_format(ckpt.kind).name,
                               Path(scratch) / "staged", options=options)
        convert_to_gguf(staged, hf_dir, tmp / name, log, outtype)
    base = options.base_model or base_model_id(ckpt.meta.get("target"))
    meta = {**ckpt.meta, "export": {"format": "gguf", "base_model": base, "file": name,
                                    "outtype": outtype}}
    write_json(tmp / DRAFTER_CONFIG, meta)
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    (tmp / CARD).write_text(model_card(meta, gguf_format(ckpt.kind), base, files, eval_payload))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out
