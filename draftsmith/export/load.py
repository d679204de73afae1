"""Loading exported or published drafters (any format in `FORMATS`) into draftsmith's modules, so
they can be evaluated or trained further. The format is detected from `config.json`; every load is
checked against the target first (see validate.py).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from draftsmith.drafter_folder import DRAFTER_CONFIG, LoadedDrafter, load_drafter
from draftsmith.errors import DraftsmithError
from draftsmith.export.formats import detect_format, get_format
from draftsmith.export.record import ExportedDrafter
from draftsmith.export.validate import check_config_keys, check_export_fits_target
from draftsmith.export.weights import read_json, read_weights
from draftsmith.registry import get_spec

CONFIG = "config.json"


def is_exported_folder(folder: str | Path) -> bool:
    """True for an export / published checkpoint (it has config.json); draftsmith's own training
    output has `draftsmith_drafter.json` and no config.json."""
    return (Path(folder) / CONFIG).is_file()


def read_exported(folder: str | Path, allow_pickle: bool = False
                  ) -> tuple[ExportedDrafter, dict | None]:
    """Read an export folder without a target.

    Returns:
        (the drafter in draftsmith's names, the training metadata `draftsmith_drafter.json` when
        the export carries it, else None).

    Raises:
        DraftsmithError: no config.json, unknown format, pickle refused, malformed tensors.
    """
    folder = Path(folder)
    if not folder.is_dir():
        state = "is a file" if folder.exists() else "does not exist"
        raise DraftsmithError(f"{folder} {state}; pass the folder `draftsmith export --out` wrote "
                              "(or a published drafter's folder)")
    if not is_exported_folder(folder):
        own = (folder / DRAFTER_CONFIG).is_file()
        fix = (f"it is a draftsmith training output: export it first with `draftsmith export "
               f"{folder} --format FORMAT --out DIR`, then check DIR" if own else
               "pass the folder `draftsmith export --out` wrote")
        raise DraftsmithError(f"{folder} has no {CONFIG}: not an exported drafter; {fix}")
    config = read_json(folder / CONFIG)
    tensors = read_weights(folder, allow_pickle=allow_pickle)
    fmt = detect_format(config, set(tensors), str(folder))
    drafter = fmt.read(config, tensors, str(folder))
    meta = read_json(folder / DRAFTER_CONFIG) if (folder / DRAFTER_CONFIG).is_file() else None
    return drafter, meta


def check_exported(folder: str | Path, target_config, allow_pickle: bool = False
                   ) -> ExportedDrafter:
    """Validate an export folder against a target config (no weights of the target needed).

    Raises:
        DraftsmithError: as `read_exported`, a config.json key the engines need that is missing or
            disagrees with the tensors, or a mismatch with the target naming both values.
    """
    drafter, _ = read_exported(folder, allow_pickle=allow_pickle)
    check_export_fits_target(drafter, target_config, str(folder))
    check_config_keys(drafter, read_json(Path(folder) / CONFIG), str(folder),
                      get_format(drafter.format))
    return drafter


def load_exported(folder: str | Path, target: nn.Module, allow_pickle: bool = False
                  ) -> LoadedDrafter:
    """Build the draftsmith drafter of an export folder for `target` and load its weights.

    Frozen copies of the target's embedding / head that the export leaves out are copied from the
    target. The module ends on the target's device and dtype, in eval mode without gradients.

    Raises:
        DraftsmithError: as `check_exported`, or tensors that do not fit the drafter module.
    """
    where = str(folder)
    drafter, saved_meta = read_exported(folder, allow_pickle=allow_pickle)
    check_export_fits_target(drafter, target.config, where)
    spec = get_spec(drafter.kind)
    if spec.reads_aux_layers and not drafter.aux_layer_ids:
        warnings.warn(f"{where} records no {spec.title} aux layer ids; assuming the default for "
                      "this target, which serving engines also assume", stacklevel=2)
    config = spec.make_config(drafter.settings)
    module = spec.build(target.config, config)
    _load_state(module, drafter, target, where)
    param = next(target.parameters())
    module.to(device=param.device, dtype=param.dtype).eval().requires_grad_(False)
    meta = dict(saved_meta or {})
    meta.setdefault("kind", drafter.kind)
    meta.setdefault("drafter_config", asdict(config))
    meta.setdefault("target", drafter.base_model)
    meta.setdefault("training_steps", None)
    meta.setdefault("lora", False)
    meta.update(format=drafter.format, source=where,
                aux_layers=list(getattr(module, "layer_ids", [])))
    return LoadedDrafter(kind=drafter.kind, module=module, meta=meta)


def load_any_drafter(folder: str | Path, target: nn.Module, allow_pickle: bool = False
                     ) -> LoadedDrafter:
    """`load_exported` for export folders, draftsmith's own `load_drafter` otherwise."""
    if is_exported_folder(folder):
        return load_exported(folder, target, allow_pickle=allow_pickle)
    return load_drafter(folder, target)


def _load_state(module: nn.Module, drafter: ExportedDrafter, target: nn.Module, where: str) -> None:
    """Copy `drafter.state` into `module`; shapes must match, only frozen copies may be absent."""
    expected = {k: v for k, v in module.state_dict().items() if not k.startswith("rotary.")}
    state = drafter.state
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise DraftsmithError(f"{where}: tensors without a place in draftsmith's {drafter.kind} "
                              f"drafter: {unexpected[:5]}")
    for name, value in state.items():
        if tuple(value.shape) != tuple(expected[name].shape):
            raise DraftsmithError(
                f"{where}: {name} has shape {list(value.shape)} but draftsmith's {drafter.kind} "
                f"drafter for this target needs {list(expected[name].shape)} (draftsmith's drafter "
                "layer mirrors the target's hidden, intermediate and head sizes)")
    missing = sorted(set(expected) - set(state))
    # frozen copies of the target's tensors (registry) are taken from the target when left out
    not_frozen = [k for k in missing if not k.startswith(get_spec(drafter.kind).frozen_prefixes)]
    if not_frozen:
        raise DraftsmithError(f"{where}: trained tensors missing from the export: {not_frozen[:5]}")
    with torch.no_grad():
        module.load_state_dict(state, strict=False)
        if missing:
            module.init_from_target(target)
            module.load_state_dict(state, strict=False)
