"""The shapes a memory plan needs, from configs alone: the target built from its config on the
meta device (no weights, no download) and the drafter built from the registry the same way;
parameters are counted from the real modules' tensors.

Where a target's config comes from: `--target-config` (a config.json or a folder holding one),
an offline model's converted folder, a local folder or .gguf file, the Hub configs shipped in
`target_configs.json` (the recipes' 8B targets), or the local Hugging Face cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.registry import get_spec

SHIPPED = "target_configs.json"


@dataclass(frozen=True)
class ModelShapes:
    """Target and drafter sizes for one recipe.

    Attributes:
        config_source: where the target's config was read from (for the report).
        target_params: parameters of the target (tied weights once).
        hidden, layers, intermediate, heads, kv_heads, head_dim, vocab: the target's shapes.
        drafter_trainable: drafter parameters that train (AdamW holds state for these).
        drafter_frozen: drafter parameters copied from the target and frozen (its embedding).
        drafter_buffer_bytes: the drafter's buffers (EAGLE-3's d2t / t2d).
        draft_vocab: width of the drafter's own head (EAGLE-3: Vd).
        drafter_intermediate: MLP width of the drafter's decoder layer.
        ttt_steps: training-time-test steps the loss unrolls.
        hidden_indices: target hidden states the drafter reads (the last one included).
    """

    config_source: str
    target_params: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    drafter_trainable: int
    drafter_frozen: int
    drafter_buffer_bytes: int
    draft_vocab: int
    drafter_intermediate: int
    ttt_steps: int
    hidden_indices: int


def shipped_configs() -> dict[str, dict]:
    """Hub id -> config.json fields shipped with draftsmith."""
    text = resources.files("draftsmith.plan").joinpath(SHIPPED).read_text()
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


def target_config(name: str, config_path: str | None = None, trust_remote_code: bool = False):
    """The target's transformers config and where it came from, without downloading anything.

    Raises:
        DraftsmithError: no config found locally for `name`, naming how to give one.
    """
    from transformers import AutoConfig

    from draftsmith.target import offline_models

    if config_path is not None:
        path = Path(config_path)
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise DraftsmithError(f"--target-config {config_path}: no such file (pass a "
                                  "config.json or the model folder holding one)")
        try:
            values = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            raise DraftsmithError(f"--target-config {config_path} is not a JSON config ({err}); "
                                  "pass the model's config.json or the folder holding it") from None
        if not isinstance(values, dict):
            raise DraftsmithError(f"--target-config {config_path} holds a JSON "
                                  f"{type(values).__name__}, not a config object; pass the "
                                  "model's config.json or the folder holding it")
        return _from_dict(values, str(file))
    if name in offline_models.CATALOG:
        folder = offline_models.model_dir(name)
        if not (folder / "config.json").is_file():
            raise DraftsmithError(f"offline model {name} is not fetched; run `draftsmith models "
                                  f"fetch {name}` or pass --target-config CONFIG.json")
        return AutoConfig.from_pretrained(folder), str(folder / "config.json")
    path = Path(name)
    if path.is_dir() and (path / "config.json").is_file():
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code), \
            str(path / "config.json")
    if path.suffix == ".gguf" and path.is_file():
        return AutoConfig.from_pretrained(path.parent, gguf_file=path.name), str(path)
    shipped = shipped_configs()
    if name in shipped:
        return _from_dict(shipped[name], f"shipped in draftsmith/plan/{SHIPPED}")
    try:
        config = AutoConfig.from_pretrained(name, local_files_only=True,
                                            trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        raise DraftsmithError(
            f"no config for target {name!r} on this machine (draftsmith ships those of "
            f"{', '.join(shipped)}); pass --target-config CONFIG.json (the model's config.json) "
            "or a local model folder as target.name") from None
    return config, f"the Hugging Face cache ({name})"


def _from_dict(values: dict, source: str):
    from transformers import AutoConfig

    values = dict(values)
    model_type = values.pop("model_type", None)
    if not model_type:
        raise DraftsmithError(f"{source} has no model_type; pass the model's own config.json")
    return AutoConfig.for_model(model_type, **values), source


def count_parameters(module: torch.nn.Module, trainable: bool | None = None) -> int:
    """Parameters of `module` (shared tensors once); only (non-)trainable ones when asked."""
    return sum(p.numel() for p in module.parameters()
               if trainable is None or p.requires_grad == trainable)


def meta_target(config) -> torch.nn.Module:
    """The causal LM for `config` on the meta device: real modules, no memory, no weights."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def model_shapes(recipe, config_path: str | None = None) -> ModelShapes:
    """Target and drafter shapes for a training recipe (both built on the meta device).

    Raises:
        DraftsmithError: no local config for the target, or a drafter kind the memory model does
            not cover (one without training-time test and a decoder layer).
    """
    config, source = target_config(recipe.target.name, config_path,
                                   recipe.target.trust_remote_code)
    target = meta_target(config)
    text = target.config.get_text_config()
    spec = get_spec(recipe.kind)
    spec.check_target(target, repr(recipe.target.name))
    drafter_config = recipe.drafter_config
    with torch.device("meta"):
        drafter = spec.build(target.config, drafter_config)
    layer = getattr(drafter, "layer_config", None)
    ttt_steps = getattr(drafter_config, "ttt_steps", None)
    if layer is None or ttt_steps is None:
        raise DraftsmithError(f"draftsmith plan models drafters with training-time test (a "
                              f"ttt_steps setting: EAGLE-3); drafter kind {recipe.kind!r} has "
                              "none yet")
    heads = text.num_attention_heads
    return ModelShapes(
        config_source=source,
        target_params=count_parameters(target),
        hidden=text.hidden_size,
        layers=text.num_hidden_layers,
        intermediate=text.intermediate_size,
        heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        vocab=text.vocab_size,
        drafter_trainable=count_parameters(drafter, trainable=True),
        drafter_frozen=count_parameters(drafter, trainable=False),
        drafter_buffer_bytes=sum(b.numel() * b.element_size() for b in drafter.buffers()),
        draft_vocab=drafter.lm_head.out_features,
        drafter_intermediate=layer.intermediate_size,
        ttt_steps=int(ttt_steps),
        hidden_indices=len(spec.hidden_indices(text.num_hidden_layers, drafter_config)),
    )
