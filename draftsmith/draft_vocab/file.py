"""`draft_vocab.safetensors`: `d2t` and `t2d` with the coverage in its metadata, written
atomically by the data pipeline and read back by training, checked against the target."""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from draftsmith.draft_vocab.vocab import DraftVocab
from draftsmith.errors import DraftsmithError
from draftsmith.files import write_atomic


def save_draft_vocab(vocab: DraftVocab, path: str | Path) -> Path:
    """Write `d2t` and `t2d` to a safetensors file (coverage in its metadata), atomically."""
    path = Path(path)
    tensors = {"d2t": vocab.d2t.contiguous(), "t2d": vocab.t2d.contiguous()}
    write_atomic(path, lambda tmp: save_file(tensors, str(tmp),
                                             metadata={"coverage": repr(vocab.coverage)}))
    return path


def load_draft_vocab(path: str | Path) -> DraftVocab:
    """Read a file written by `save_draft_vocab`.

    Raises:
        DraftsmithError: the file is missing or lacks d2t/t2d.
    """
    path = Path(path)
    if not path.is_file():
        raise DraftsmithError(f"draft vocabulary {path} does not exist; build it with "
                              "`draftsmith data run` and data.draft_vocab_size set")
    with safe_open(path, framework="pt") as handle:
        if not {"d2t", "t2d"} <= set(handle.keys()):
            raise DraftsmithError(f"{path} holds {sorted(handle.keys())}, not d2t and t2d")
        coverage = float((handle.metadata() or {}).get("coverage", "nan"))
        return DraftVocab(handle.get_tensor("d2t"), handle.get_tensor("t2d"), coverage)


def read_draft_vocab(path: Path, vocab_size: int) -> DraftVocab | None:
    """The data's draft vocabulary (None when there is no file), checked against the target:
    t2d has one entry per target token, d2t one per chosen token, and every draft id maps to a
    target id that t2d marks.

    Raises:
        DraftsmithError: the file is damaged or was built for another vocabulary.
    """
    if not path.is_file():
        return None
    fix = (f"delete {path} and run `draftsmith data run` again (with data.draft_vocab_size set) "
           "to rebuild it for this target")
    try:
        vocab = load_draft_vocab(path)
    except (SafetensorError, OSError) as err:
        raise DraftsmithError(f"{path} is damaged (not readable safetensors: {err}); "
                              f"{fix}") from None
    if vocab.t2d.dim() != 1 or vocab.t2d.numel() != vocab_size:
        raise DraftsmithError(f"{path} is for a vocabulary of {vocab.t2d.numel():,} tokens (t2d "
                              f"shape {list(vocab.t2d.shape)}) but the target has {vocab_size:,}; "
                              f"{fix}")
    chosen = int(vocab.t2d.sum())
    consistent = vocab.d2t.dim() == 1 and vocab.d2t.numel() == chosen
    if consistent and chosen:
        mapped = vocab.draft_to_target
        consistent = (int(mapped.min()) >= 0 and int(mapped.max()) < vocab_size
                      and bool(vocab.t2d.bool()[mapped].all()))
    if not consistent:
        raise DraftsmithError(f"{path} is inconsistent: d2t (shape {list(vocab.d2t.shape)}) does "
                              f"not map onto the {chosen:,} tokens t2d marks; {fix}")
    return vocab
