"""The training state of an FSDP2-sharded drafter, saved and loaded sharded with
torch.distributed.checkpoint (DCP): each process writes and reads only its own shards of the
weights and optimizer states (`__RANK_0.distcp`), nothing is gathered on one rank, and a run on
another number of processes could still read them (DCP re-shards). A replicated (DDP) drafter
keeps accelerate's checkpoint files (`checkpoint.py`).

Nothing is unpickled but plain values: DCP's `.metadata` is a pickle, read here by an unpickler
that resolves only DCP's metadata classes and torch's sizes, dtypes and layouts; its non-tensor
items (an optimizer's settings, a gradient scaler's scale) are read with
`torch.load(weights_only=True)`, where DCP itself would unpickle anything.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.api import CheckpointException

from draftsmith.errors import DraftsmithError

SHARDED_DIR = "sharded"  # the DCP folder inside a checkpoint `step_N`
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
            ("torch", "Size"), ("torch.serialization", "_get_layout"),
            ("pathlib", "PosixPath"), ("pathlib", "WindowsPath")}


def is_sharded(model: nn.Module) -> bool:
    """True when some parameter of `model` is a DTensor (an FSDP2 shard)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def holds_sharded_model(accelerator) -> bool:
    """True when the run's prepared model is FSDP2-sharded (saved with `save_sharded_state`)."""
    return any(is_sharded(model) for model in accelerator._models)


def prepared_parts(accelerator) -> tuple[nn.Module, torch.optim.Optimizer, object | None]:
    """The run's one prepared model, its optimizer (unwrapped from accelerate's) and gradient
    scaler (fp16 only, else None), as `accelerator.save_state` finds them."""
    models, optimizers = accelerator._models, accelerator._optimizers
    if len(models) != 1 or len(optimizers) != 1:
        raise DraftsmithError(f"a sharded checkpoint holds one model and one optimizer; this run "
                              f"prepared {len(models)} and {len(optimizers)} (a draftsmith bug)")
    return models[0], getattr(optimizers[0], "optimizer", optimizers[0]), accelerator.scaler


def _state(model: nn.Module, optimizer, scaler) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    if scaler is not None:  # fp16 mixed precision: the loss scale and its growth counter
        state["scaler"] = scaler.state_dict()
    return state


def save_sharded_state(folder: Path, model: nn.Module, optimizer, scaler=None) -> None:
    """Write `model`, `optimizer` (and a gradient `scaler`) to `folder` with DCP, each process
    its own shards (every process must call it)."""
    dcp.save(_state(model, optimizer, scaler), storage_writer=dcp.FileSystemWriter(str(folder)))


def load_sharded_state(folder: Path, model: nn.Module, optimizer, scaler=None) -> None:
    """Read what `save_sharded_state` wrote into `model`, `optimizer` (and `scaler`), each
    process its own shards (every process must call it).

    Raises:
        DraftsmithError: the metadata or a value is a pickle of anything but plain values, or
            the state does not fit this model and optimizer.
    """
    from torch.distributed.checkpoint.state_dict import set_state_dict

    read_metadata(folder / ".metadata")  # refused here, in its own words, before DCP reads it
    state = _state(model, optimizer, scaler)
    try:
        dcp.load(state, storage_reader=PlainMetadataReader(str(folder)),
                 planner=PlainValuesLoadPlanner())
    except (CheckpointException, RuntimeError, ValueError, KeyError, OSError) as err:
        raise _load_error(folder, err) from None
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    if scaler is not None:
        scaler.load_state_dict(state["scaler"])


def _load_error(folder: Path, err: BaseException) -> DraftsmithError:
    """One error for a failed DCP load: draftsmith's own refusal where a process raised one, else
    the first process's reason. DCP gathers them into a CheckpointException (rank: (error, trace))."""
    failures = getattr(err, "failures", {0: (err, None)})
    causes = [cause for cause, _ in failures.values()] or [err]
    own = next((cause for cause in causes if isinstance(cause, DraftsmithError)), None)
    if own is not None:
        return DraftsmithError(str(own))
    reason = str(causes[0]).splitlines()[0][:200] if str(causes[0]) else type(causes[0]).__name__
    return DraftsmithError(f"{folder} does not fit this run's drafter and optimizer or is "
                           f"damaged ({reason})")


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only DCP's metadata classes and torch's sizes, dtypes and layouts."""

    def find_class(self, module: str, name: str):
        if module == _METADATA_MODULE:
            found = getattr(dcp_metadata, name, None)
            if isinstance(found, type) and (dataclasses.is_dataclass(found)
                                            or issubclass(found, enum.Enum)):
                return found
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        elif (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a DCP checkpoint's metadata")


def read_metadata(path: Path):
    """DCP's `.metadata` file, unpickled by `_MetadataUnpickler`.

    Raises:
        DraftsmithError: it names anything else (it could run code) or is damaged.
    """
    try:
        with open(path, "rb") as handle:
            return _MetadataUnpickler(handle).load()
    except (pickle.UnpicklingError, EOFError, OSError, AttributeError, TypeError,
            ValueError) as err:
        raise DraftsmithError(f"{path} is not the metadata of a sharded checkpoint ({err}); "
                              "draftsmith never unpickles other objects from a checkpoint (they "
                              "can run code)") from None


class PlainMetadataReader(dcp.FileSystemReader):
    """DCP's file reader, its metadata read by `read_metadata` instead of `pickle.load`."""

    def read_metadata(self, *args, **kwargs):
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        if not path.is_file():  # DCP looks for a rank's own metadata first, then the global one
            raise FileNotFoundError(path)
        metadata = read_metadata(path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class PlainValuesLoadPlanner(dcp.DefaultLoadPlanner):
    """DCP's load planner, its non-tensor values read with `torch.load(weights_only=True)`."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        fqn = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise DraftsmithError(f"the sharded checkpoint's value {fqn!r} pickles objects other "
                                  f"than plain values ({str(err).splitlines()[0][:160]}); "
                                  "draftsmith never unpickles those (they can run code)") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded

