"""The target GGUF that llama.cpp serves, checked before anything is converted or served.

Its bytes: a GGUF of the offline catalog (found by its place in the cache or its size) must have
the catalog's sha256; any other GGUF must match a `FILE.gguf.sha256` beside it when there is one
(`sha256sum FILE.gguf > FILE.gguf.sha256` writes it). Either way the file is read once in full
(about a second per GB) and its sha256 goes into `serve_check.json`, so the check names exactly the
bytes it passed. Its identity: unless it is the catalog GGUF of the `--target` itself, the GGUF's
header (read with the `gguf` package: architecture, hidden size, layer count, vocabulary rows)
must describe the same model as the target's Hugging Face config; a file whose header or tensor
table does not parse is refused too. A user's GGUF without a `.sha256` file is only checked by its
header: one flipped byte in its weights cannot be told from a real model, and serve-check says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.files import sha256_file
from draftsmith.target import offline_models

# Hugging Face model_type -> llama.cpp's GGUF architecture, where the names differ beyond `_`/`-`
GGUF_ARCHITECTURE = {"mistral": "llama", "mixtral": "llama", "phi": "phi2",
                     "gpt_bigcode": "starcoder", "cohere": "command-r",
                     "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2"}


@dataclass(frozen=True)
class ModelShape:
    """What identifies a model across formats; None where the source does not say."""

    architecture: str
    hidden_size: int | None
    num_layers: int | None
    vocab_size: int | None

    def describe(self) -> str:
        return (f"{self.architecture}, hidden size {self.hidden_size}, {self.num_layers} layers, "
                f"vocab {self.vocab_size}")


def _scalar(reader, key: str):
    """A string or number from a GGUF header; None when the key is absent."""
    from gguf import GGUFValueType

    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    if field.types[0] == GGUFValueType.STRING:
        return bytes(value).decode("utf-8", "replace")
    return value[0].item()


def read_gguf_shape(path: Path) -> ModelShape:
    """The model a GGUF file holds, from its header and tensor table (a few seconds for a file
    with a 50k-token vocabulary: the `gguf` package parses every metadata entry).

    Raises:
        DraftsmithError: the file is not a readable GGUF (bad magic, truncated, damaged table).
    """
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        arch = _scalar(reader, "general.architecture")
        embedding = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    except (ValueError, OSError, IndexError, KeyError, TypeError, OverflowError,
            UnicodeDecodeError) as err:
        raise DraftsmithError(f"{path} is not a readable GGUF file ({type(err).__name__}: {err}); "
                              "it is truncated or damaged: copy or convert it again") from None
    if not isinstance(arch, str):
        raise DraftsmithError(f"{path} has no general.architecture in its header: not a model "
                              "GGUF llama.cpp can serve; convert the target again")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = (int(embedding.shape[-1]) if embedding is not None and len(embedding.shape) == 2
             else _scalar(reader, f"{arch}.vocab_size") or (len(tokens.data) if tokens else None))
    return ModelShape(arch, _scalar(reader, f"{arch}.embedding_length"),
                      _scalar(reader, f"{arch}.block_count"), vocab)


def config_shape(config) -> ModelShape:
    """The same facts from a transformers config (its text part for multimodal models)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = str(getattr(text, "model_type", "") or getattr(config, "model_type", ""))
    return ModelShape(model_type, getattr(text, "hidden_size", None),
                      getattr(text, "num_hidden_layers", None), getattr(text, "vocab_size", None))


def _same_architecture(model_type: str, gguf_arch: str) -> bool:
    def norm(name: str) -> str:
        return name.lower().replace("_", "").replace("-", "")

    return norm(GGUF_ARCHITECTURE.get(model_type, model_type)) == norm(gguf_arch)


def check_same_model(gguf: Path, target: str, config, log: Callable[[str], None] = print) -> None:
    """Refuse a GGUF whose hidden size, layer count or vocabulary differs from the target's
    config; a different architecture name with equal sizes is only warned about (llama.cpp names
    some architectures its own way).

    Raises:
        DraftsmithError: naming both models and what differs.
    """
    file, hf = read_gguf_shape(gguf), config_shape(config)
    differ = [f"{what} {a} vs {b}" for what, a, b in (
        ("hidden size", hf.hidden_size, file.hidden_size),
        ("layers", hf.num_layers, file.num_layers),
        ("vocab size", hf.vocab_size, file.vocab_size)) if a is not None and a != b]
    same_arch = _same_architecture(hf.architecture, file.architecture)
    if differ:
        if not same_arch:
            differ.insert(0, f"architecture {hf.architecture} vs {file.architecture}")
        raise DraftsmithError(
            f"--target {target} ({hf.describe()}) and --target-gguf {gguf} ({file.describe()}) "
            f"are different models ({'; '.join(differ)}, target vs GGUF): give the GGUF of the "
            "target's own model (for an offline model, leave out --target-gguf and its fetched "
            "GGUF is used)")
    if not same_arch:
        log(f"note: {gguf} says architecture {file.architecture!r}, --target {target} says "
            f"{hf.architecture!r}; their sizes and vocabulary agree, so it is served")


def _recorded_sha256(sidecar: Path) -> str:
    try:
        digest = sidecar.read_text(encoding="utf-8").split()[0].lower()
    except (OSError, UnicodeDecodeError, IndexError):
        digest = ""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise DraftsmithError(f"{sidecar} holds no sha256 (64 hex digits, as `sha256sum` writes); "
                              f"write it again with `sha256sum {sidecar.with_suffix('')} > "
                              f"{sidecar}` from a good copy, or delete it")
    return digest


def check_target_gguf(gguf: Path, target: str, target_dir: Path,
                      log: Callable[[str], None] = print) -> dict:
    """Check the GGUF llama.cpp will serve for `target` (see the module docstring).

    Args:
        gguf: the file (`--target-gguf`, or the offline model's fetched GGUF).
        target: the `--target` spec, for messages.
        target_dir: the target's Hugging Face folder (its config.json is compared).

    Returns:
        For serve_check.json: `target_gguf`, `target_gguf_sha256`, `target_gguf_verified`.

    Raises:
        DraftsmithError: a missing, corrupted or unreadable file, or another model than the
            target; each message names the file and what redoes or replaces it.
    """
    if not gguf.is_file():
        fix = (f"run `draftsmith models fetch {target}`" if target in offline_models.CATALOG
               else "pass the target's GGUF file")
        raise DraftsmithError(f"target GGUF {gguf} does not exist; {fix}")
    catalog = offline_models.verify_gguf_file(gguf, cached=False)
    if catalog is not None:
        digest, how = catalog.sha256, f"sha256 of {catalog.name} in draftsmith's catalog"
    else:
        digest = sha256_file(gguf)
        sidecar = gguf.with_name(gguf.name + ".sha256")
        if sidecar.is_file():
            if _recorded_sha256(sidecar) != digest:
                raise DraftsmithError(f"{gguf} is corrupted: its sha256 {digest} differs from the "
                                      f"one recorded in {sidecar}; copy or convert it again")
            how = f"sha256 recorded in {sidecar.name}"
        else:
            how = "header only"
    if catalog is None or catalog.name != target:
        check_same_model(gguf, target, _folder_config(target_dir), log)
    if how == "header only":
        log(f"note: no {gguf.name}.sha256 beside {gguf}: only its header is checked against the "
            f"target (record its sha256 with `sha256sum {gguf} > {gguf}.sha256`)")
    return {"target_gguf": str(gguf), "target_gguf_sha256": digest, "target_gguf_verified": how}


def _folder_config(target_dir: Path):
    """The transformers config of the target's Hugging Face folder (no weights read).

    Raises:
        DraftsmithError: the folder holds no readable config.json.
    """
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(target_dir))
    except (OSError, ValueError) as err:
        raise DraftsmithError(f"could not read the config of the target folder {target_dir}: "
                              f"{err}") from err


def _folder_key(folder: Path) -> str:
    """A short digest of a model folder's files (name, size, modification time)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def converted_target_gguf(target_dir: Path, outtype: str,
                          log: Callable[[str], None] = print) -> Path:
    """The target's folder as a llama.cpp GGUF of `outtype`, converted once into the cache (see
    the module docstring); a cached file without its `.sha256` is converted again."""
    from draftsmith.llama_cpp.convert import convert_model_to_gguf

    out = (offline_models.cache_dir() / "gguf" / "converted" / _folder_key(target_dir)
           / f"{target_dir.name}-{outtype}.gguf")
    sidecar = out.with_name(out.name + ".sha256")
    if out.is_file() and sidecar.is_file():
        return out
    sidecar.unlink(missing_ok=True)
    convert_model_to_gguf(target_dir, out, outtype, log)
    partial = sidecar.with_name(sidecar.name + ".partial")
    partial.write_text(f"{sha256_file(out)}  {out.name}\n", encoding="utf-8")
    partial.replace(sidecar)
    return out
