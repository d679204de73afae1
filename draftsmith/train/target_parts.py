"""The frozen target as training needs it: sharded across ranks under FSDP, or only its parts.

Under FSDP (`recipes/accelerate/fsdp.yaml`) every rank builds the target on the `meta` device,
applies FSDP2 `fully_shard` to each decoder layer and to every other module holding weights (the
embeddings, the final norm, the output head, each its own unit so that it gathers its weights when
called on its own), then to the whole model once as the one root over them (`shard_target`), and
reads from the safetensors files only the rows of each tensor that its shard holds, straight onto
its device: no rank ever holds the whole target. A tied output head is untied into its own
(sharded) copy first. With one root every unit shares its all-gather streams, and each unit's
pre-forward starts the next one's all-gather (explicit forward prefetch), so a layer's weights
arrive while the layer before it computes instead of after. Offline training (features from the
hidden-state cache) reads only the input embeddings and the output head (the cached last hidden
state is already normalised); the rest of the model stays on `meta`.

Weights are read from the checkpoint under the model's own parameter names (`model.` prefixes as
transformers saves them); a checkpoint that stores them otherwise (a GGUF file, a renamed layout)
is refused with the fix.
"""

from __future__ import annotations

import itertools
import json
import os
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from draftsmith.errors import DraftsmithError

INDEX = "model.safetensors.index.json"


def fsdp_requested(accelerator) -> bool:
    """True when the launch asked for FSDP: accelerate's plugin is active (GPUs), or its launcher
    set `ACCELERATE_USE_FSDP` on a CPU host, where accelerate runs the drafter data-parallel
    (gloo) and draftsmith still shards the target.

    Raises:
        DraftsmithError: FSDP version 1 (its flat parameters cannot hold a frozen target apart).
    """
    from accelerate.utils import DistributedType

    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    active = accelerator.distributed_type == DistributedType.FSDP
    asked = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if not (active or asked):
        return False
    version = int(getattr(plugin, "fsdp_version", None) or os.environ.get("FSDP_VERSION", "1"))
    if version != 2:
        raise DraftsmithError(f"FSDP version {version} is not supported for training drafters: "
                              "set `fsdp_version: 2` in the accelerate config (see "
                              "recipes/accelerate/fsdp.yaml) or pass `--fsdp_version 2`")
    return accelerator.num_processes > 1


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """Which safetensors file of `folder` holds each tensor name.

    Raises:
        DraftsmithError: the folder holds no safetensors weights.
    """
    index = folder / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        raise DraftsmithError(f"{folder} holds no safetensors weights (model.safetensors or "
                              f"{INDEX}); sharded and offline training read them tensor by tensor: "
                              "save the target with `save_pretrained` (safetensors) or train "
                              "single-process online")
    from safetensors import safe_open

    with safe_open(single, "pt") as handle:
        return {name: single for name in handle.keys()}  # noqa: SIM118 (a safe_open handle)


def target_folder(spec) -> Path:
    """The local folder of a target spec's weights (a folder, or an offline model's).

    Raises:
        DraftsmithError: a GGUF file (quantized blocks, not rows to shard) or a Hub id (its
            weights fingerprint is taken from loaded tensors, which no rank holds whole here).
    """
    from draftsmith.target.source import resolve_source

    source, kwargs = resolve_source(spec.name)
    if "gguf_file" in kwargs or not Path(source).is_dir():
        raise DraftsmithError(
            f"target {spec.name!r} is not a local transformers folder; sharded (FSDP) and offline "
            "training read safetensors weights tensor by tensor from one: download a Hub model "
            "with `huggingface-cli download ORG/NAME --local-dir DIR` (or name the folder a GGUF was "
            "converted from) and set target.name to DIR")
    return Path(source)


def empty_target(spec, device: str):
    """The target's architecture with parameters on `meta` (buffers real, on the CPU), its
    tokenizer and the dtype choice; nothing of the weights is read."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from draftsmith.target.load import _choose_dtype, load_tokenizer, resolve_dtype

    folder = target_folder(spec)
    remote = spec.trust_remote_code
    choice = _choose_dtype(spec.name, (str(folder), {}), spec.dtype, device, remote)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=remote)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(choice.dtype),
                                                 trust_remote_code=remote)
    model.config._name_or_path = str(folder)  # the weights fingerprint reads the folder's files
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return model.eval().requires_grad_(False), load_tokenizer(spec.name, trust_remote_code=remote), \
        choice, folder


def untie_output_head(model) -> dict[str, str]:
    """Give a tied output head its own parameter (so it can be its own shard unit); returns
    {head parameter name: checkpoint name it is read from} for a tied head (else {})."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    config = model.config.get_text_config()
    if head is None or not (head.weight is embed.weight or config.tie_word_embeddings):
        return {}
    embed_name = next(n for n, p in model.named_parameters() if p is embed.weight)
    if head.weight is embed.weight:
        head.weight = nn.Parameter(torch.empty_like(embed.weight), requires_grad=False)
    head_name = next(n for n, p in model.named_parameters() if p is head.weight)
    return {head_name: embed_name}


def shard_units(model) -> list[nn.Module]:
    """The FSDP units of a frozen causal LM: each decoder layer, then every other module that
    holds parameters of its own (embeddings, final norm, output head), innermost first."""
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise DraftsmithError(f"{type(model).__name__} keeps no `layers` list in its decoder, so "
                              "draftsmith cannot shard it layer by layer; train it without FSDP "
                              "(recipes/accelerate/ddp.yaml)")
    inside = {id(p) for layer in layers for p in layer.parameters()}
    others = [m for m in model.modules()
              if any(id(p) not in inside for p in m.parameters(recurse=False))]
    return [*layers, *reversed(others)]  # a nested unit is sharded before its parent


def read_rows(files: dict[str, Path], name: str, rows: slice | None, dtype) -> torch.Tensor:
    """Rows `rows` (None: all) of checkpoint tensor `name`, read without loading the rest."""
    from safetensors import safe_open

    with safe_open(files[name], "pt") as handle:
        part = handle.get_slice(name)
        tensor = part[rows] if rows is not None and part.get_shape() else part[:]
    return tensor.to(dtype)


def _missing(folder: Path, names: list[str]) -> DraftsmithError:
    return DraftsmithError(
        f"{folder} stores no tensors named {names[:4]}{' ...' if len(names) > 4 else ''} (the "
        "model's own parameter names, which sharded and offline training read); re-save the "
        "target with transformers' `save_pretrained`, or train single-process online")


def load_sharded_target(spec, device: str):
    """The target sharded across this run's ranks (FSDP2), each rank reading only its rows.

    Returns:
        a `draftsmith.target.load.Target` whose model's parameters are DTensors sharded on dim 0.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from draftsmith.target.load import Target

    model, tokenizer, choice, folder = empty_target(spec, device)
    aliases = untie_output_head(model)
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    world, rank = dist.get_world_size(), dist.get_rank()
    shard_target(model, init_device_mesh(torch.device(device).type, (world,)))
    model.to_empty(device=device)
    for name, buffer in model.named_buffers():
        buffer.copy_(buffers[name])
    files = checkpoint_files(folder)
    missing = [aliases.get(n, n) for n, _ in model.named_parameters()
               if aliases.get(n, n) not in files]
    if missing:
        raise _missing(folder, missing)
    for name, param in model.named_parameters():
        local = param.to_local()  # rows [rank * ceil(n / world), ...) of dim 0, as torch.chunk cuts
        if local.numel():
            start = rank * -(-param.shape[0] // world)
            local.copy_(read_rows(files, aliases.get(name, name),
                                  slice(start, start + local.shape[0]), local.dtype))
    make_root(model)
    return Target(model=model, tokenizer=tokenizer, spec=spec.name, dtype_choice=choice)


def shard_target(model, mesh) -> None:
    """FSDP2 over a frozen causal LM on `mesh`: each of `shard_units` its own unit, then the whole
    model once as their root (it holds no weight of its own), and each decoder layer's all-gather
    started by the unit that runs before it (the embeddings, then the layer before).

    Every unit reshards after its forward: the target runs forward only (no backward would reuse
    the gathered weights), so keeping a layer whole would only hold its memory; with the prefetch
    at most two layers are whole at a time, the one computing and the next.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    order = [m for m in (model.get_input_embeddings(), *model.get_decoder().layers)
             if isinstance(m, FSDPModule)]
    for unit, following in itertools.pairwise(order):
        unit.set_modules_to_forward_prefetch([following])


def make_root(model) -> None:
    """Make the FSDP2-sharded `model` the one root over its units now, with its weights loaded.

    FSDP2 takes as root whichever unit runs forward first. Training runs the target's decoder and
    output head, never the model's own forward, so without this each unit would become a root of
    its own at its first call: its own all-gather streams, each all-gather waiting for the compute
    before it. This is FSDP2's own lazy initialisation (`FSDPState._lazy_init`, which has no
    public entry but the root's forward), run once here.
    """
    model._get_fsdp_state()._lazy_init()


def load_loss_parts(spec, device: str):
    """The target with only its input embeddings and output head read (offline training: the
    loss reads the head, `init_from_target` the embeddings and head); every other parameter
    stays on `meta`, so running the model fails loudly instead of computing with nothing."""
    from draftsmith.target.load import Target

    model, tokenizer, choice, folder = empty_target(spec, device)
    aliases = untie_output_head(model)
    files = checkpoint_files(folder)
    wanted = [model.get_input_embeddings(), model.get_output_embeddings()]
    names = {id(p): n for n, p in model.named_parameters()}
    missing = [aliases.get(names[id(m.weight)], names[id(m.weight)]) for m in wanted
               if aliases.get(names[id(m.weight)], names[id(m.weight)]) not in files]
    if missing:
        raise _missing(folder, missing)
    for module in wanted:
        name = names[id(module.weight)]
        module.weight = nn.Parameter(read_rows(files, aliases.get(name, name), None,
                                               module.weight.dtype).to(device),
                                     requires_grad=False)
    return Target(model=model, tokenizer=tokenizer, spec=spec.name, dtype_choice=choice)


def holds_whole(model: nn.Module) -> bool:
    """True when every parameter of `model` is whole here (no FSDP shard, none left on meta)."""
    from torch.distributed.tensor import DTensor

    return not any(p.is_meta or isinstance(p, DTensor) for p in model.parameters())


def local_numel(model: nn.Module) -> int:
    """Parameter elements this rank holds (its shards' rows for DTensors; meta ones count 0)."""
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel()
               for p in model.parameters() if not p.is_meta)


@contextmanager
def gathered(*modules: nn.Module):
    """Within the block, FSDP2-sharded `modules` hold their whole weights (every rank must enter
    it); other modules are left as they are."""
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in modules if isinstance(m, FSDPModule)]
    for module in sharded:
        module.unshard()
    try:
        yield
    finally:
        for module in sharded:
            module.reshard()


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict with every DTensor gathered whole, on the CPU (every rank must
    call it; each gets the whole tensors)."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().to("cpu")
            for k, v in module.state_dict().items()}
