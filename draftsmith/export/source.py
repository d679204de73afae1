"""A trained draftsmith drafter folder read without its target: weights, metadata, and the shapes
of the drafter layer, which mirrors the target config recorded at training time.

Export needs no target model: every exported config value comes from the recorded target config
(`draftsmith_drafter.json`) and is cross-checked against the tensor shapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from draftsmith.drafter_folder import read_drafter_meta, read_drafter_weights
from draftsmith.errors import DraftsmithError
from draftsmith.models.layers import drafter_layer_config

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class DraftsmithCheckpoint:
    """A drafter folder written by `draftsmith train` (`model.safetensors` + metadata)."""

    folder: Path
    meta: dict
    tensors: dict[str, torch.Tensor]

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def target_config(self) -> SimpleNamespace:
        """The target config recorded at training (attribute access, like a transformers config)."""
        return SimpleNamespace(**self.meta["target_config"])

    def layer_config(self):
        """The one-layer LlamaConfig the drafter was built with (see models/layers.py)."""
        return drafter_layer_config(self.target_config)

    def aux_layers(self) -> list[int]:
        """0-based target layer outputs the drafter reads (EAGLE-3), else []."""
        return [int(i) for i in self.meta.get("aux_layers") or []]


def read_checkpoint(folder: str | Path) -> DraftsmithCheckpoint:
    """Read a draftsmith drafter folder.

    Raises:
        DraftsmithError: the folder is not a draftsmith drafter (e.g. it is already an export), or
            its metadata or weights are missing or damaged (see `read_drafter_meta`).
    """
    folder = Path(folder)
    if (folder / "config.json").is_file():
        raise DraftsmithError(f"{folder} looks like an export already (it has config.json); export "
                              "from the training output, OUTPUT_DIR/drafter")
    meta = read_drafter_meta(folder)
    return DraftsmithCheckpoint(folder=folder, meta=meta, tensors=read_drafter_weights(folder))


def base_model_id(target: str | None) -> str | None:
    """The Hub id of a training target: offline catalog names map to their upstream id; local paths
    give None (they mean nothing to a serving engine or the Hub)."""
    from draftsmith.target import offline_models

    if not target:
        return None
    if target in offline_models.CATALOG:
        return offline_models.CATALOG[target].hub_id
    return target if HUB_ID.match(target) and not Path(target).exists() else None


def float_dtype_name(tensors: dict[str, torch.Tensor]) -> str:
    """`bfloat16` / `float16` / `float32`: the dtype of the floating tensors."""
    for value in tensors.values():
        if value.is_floating_point():
            return str(value.dtype).removeprefix("torch.")
    return "float32"


def cast_floats(tensors: dict[str, torch.Tensor], dtype: str | None) -> dict[str, torch.Tensor]:
    """Floating tensors cast to `dtype` (None keeps them); integer/bool buffers never change.

    Raises:
        DraftsmithError: unknown dtype name.
    """
    if dtype is None:
        return dict(tensors)
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in choices:
        raise DraftsmithError(f"--dtype {dtype!r} is not supported; choose one of: "
                              f"{', '.join(choices)}")
    return {k: v.to(choices[dtype]) if v.is_floating_point() else v for k, v in tensors.items()}


def llama_layer_dict(layer_config, vocab_size: int, dtype: str) -> dict:
    """The one-layer Llama config keys serving engines read for a drafter layer.

    Both RoPE spellings are written: `rope_theta`/`rope_scaling` (transformers 4, vLLM, SGLang) and
    `rope_parameters` (transformers 5).
    """
    rope = dict(layer_config.rope_parameters)
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {
        "model_type": "llama",
        "hidden_size": layer_config.hidden_size,
        "intermediate_size": layer_config.intermediate_size,
        "num_attention_heads": layer_config.num_attention_heads,
        "num_key_value_heads": layer_config.num_key_value_heads,
        "head_dim": layer_config.head_dim,
        "hidden_act": layer_config.hidden_act,
        "rms_norm_eps": layer_config.rms_norm_eps,
        "max_position_embeddings": layer_config.max_position_embeddings,
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_scaling": None if scaling.get("rope_type", "default") == "default" else scaling,
        "rope_parameters": rope,
        "num_hidden_layers": 1,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "torch_dtype": dtype,
    }


def require_shape(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...],
                  where: str) -> torch.Tensor:
    """tensors[name], checked to have `shape`.

    Raises:
        DraftsmithError: missing tensor or a shape that disagrees with the recorded config.
    """
    if name not in tensors:
        raise DraftsmithError(f"{where}: tensor {name!r} is missing")
    actual = tuple(tensors[name].shape)
    if actual != shape:
        raise DraftsmithError(f"{where}: tensor {name!r} has shape {list(actual)} but the recorded "
                              f"config implies {list(shape)}")
    return tensors[name]
