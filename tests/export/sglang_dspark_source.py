"""SGLang 0.5.23's DSpark draft (`--speculative-algorithm DSPARK`, `models/dspark.py`) read from
its released source, never imported, and the DFlash weight loader its backbone shares.

`Qwen3DSparkModel` is `DSparkDraftModel(DSparkDraftMixin, DFlashDraftModel)`: the mixin's
`super().__init__` builds the DFlash backbone (the MRO), then module-level builders add the
Markov head (`build_markov_head`: `markov_w1` Embedding(V, r), `markov_w2` Linear(r, V), V the
config's `vocab_size`) and the confidence head (`build_confidence_head`: `proj` Linear(H + r, 1)
with a bias, or none at all in the default `SGLANG_RAGGED_VERIFY_MODE=static`, whose loader then
skips `confidence_head.*`). The walker of `sglang_source` follows neither a mixin's
`super()`, nor module-level functions, nor keyword-only defaults; `DSparkSourceModels` adds the
three. What the mixin reads from outside models/ (`speculative/dspark_components/
dspark_config.py`, `speculative/ragged_verify.py`) is stood in for by `dspark_externals`."""

from __future__ import annotations

import ast
import contextlib

import torch

from tests.export.sglang_source import (
    DFLASH_EXTERNALS,
    UNKNOWN,
    DFlashDraftConfig,
    External,
    Module,
    Return,
    SourceModels,
    stacked_params_mapping,
)

RAGGED_VERIFY_MODES = ("static", "cap-accept", "compact")  # environ.py default: static
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")  # SUPPORTED_DSPARK_MARKOV_HEAD_TYPES
# the module-level functions walked (models/dspark.py's head builders); others, such as DFlash's
# attention-type helpers that read the config through functions outside models/, stay unknown
WALKED_FUNCTIONS = ("build_markov_head", "build_confidence_head")


class DSparkSourceModels(SourceModels):
    """The constructor walker, with the Python semantics `models/dspark.py` needs."""

    def __init__(self, models_dir, externals: dict | None = None):
        super().__init__(models_dir, externals)
        self._mros: list[list[tuple[ast.ClassDef, str]]] = []  # of the classes being built

    def construct(self, name: str, stem: str, config, args=(), kwargs=None):
        self._mros.append(self._linearize(*self._class(name, stem)))
        try:
            return super().construct(name, stem, config, args, kwargs)
        finally:
            self._mros.pop()

    def _linearize(self, node: ast.ClassDef, stem: str) -> list[tuple[ast.ClassDef, str]]:
        """The class's method resolution order (C3) over the classes models/ defines; bases
        from outside models/ (`ABC`, `nn.Module`) have nothing to walk and are left out."""
        bases = []
        for base in node.bases:
            if isinstance(base, ast.Name):
                with contextlib.suppress(KeyError):
                    bases.append(self._class(base.id, stem, skip_local=base.id == node.name))
        pending = [self._linearize(*base) for base in bases] + [bases]
        order = [(node, stem)]
        while any(pending):
            pending = [seq for seq in pending if seq]
            head = next((seq[0] for seq in pending if not any(
                seq[0][0] is later[0] for other in pending for later in other[1:])), None)
            if head is None:
                raise ValueError(f"{node.name}: no consistent method resolution order")
            order.append(head)
            pending = [seq[1:] if seq[0][0] is head[0] else seq for seq in pending]
        return order

    def _base(self, node: ast.ClassDef, stem: str):
        """The next class after `node` in the MRO of the class being built, so that a mixin's
        `super().__init__` (`DSparkDraftMixin`) reaches `DFlashDraftModel`; outside that MRO,
        the first base models/ defines."""
        if self._mros:
            order = self._mros[-1]
            for i, (cls, _) in enumerate(order):
                if cls is node:
                    return order[i + 1] if i + 1 < len(order) else None
        try:
            return super()._base(node, stem)
        except KeyError:
            return None

    def _run_init(self, node: ast.ClassDef, stem: str, module, config, args, kwargs):
        init = next((f for f in node.body if isinstance(f, ast.FunctionDef)
                     and f.name == "__init__"), None)
        if init is not None:  # keyword-only defaults (`*, bias: bool = True`)
            for arg, default in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True):
                if default is not None and arg.arg not in kwargs:
                    kwargs[arg.arg] = self._eval(default, {"config": config}, stem)
        super()._run_init(node, stem, module, config, args, kwargs)

    def _eval(self, node, env, stem):
        if isinstance(node, ast.Name) and node.id not in env and node.id in self.externals:
            return self.externals[node.id]  # a stand-in used as a value (`RaggedVerifyMode`)
        return super()._eval(node, env, stem)

    def _call(self, node: ast.Call, env, stem):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "str" and len(node.args) == 1:
            value = self._eval(node.args[0], env, stem)
            return UNKNOWN if value is UNKNOWN else str(value)
        if isinstance(func, ast.Attribute) and func.attr == "lower" and not node.args:
            owner = self._eval(func.value, env, stem)
            return owner.lower() if isinstance(owner, str) else UNKNOWN
        function = self._function(func, stem)
        if function is None:
            return super()._call(node, env, stem)
        args = [self._eval(a, env, stem) for a in node.args]
        kwargs = {k.arg: self._eval(k.value, env, stem) for k in node.keywords if k.arg}
        return self._run_function(function, stem, env["config"], args, kwargs)

    def _function(self, func, stem: str) -> ast.FunctionDef | None:
        """A module-level function of file `stem` called by name, one of `WALKED_FUNCTIONS`."""
        if not isinstance(func, ast.Name) or func.id not in WALKED_FUNCTIONS:
            return None
        return next((item for item in self.trees[stem].body
                     if isinstance(item, ast.FunctionDef) and item.name == func.id), None)

    def _run_function(self, function: ast.FunctionDef, stem: str, config, args, kwargs):
        env = {"config": config}
        params = function.args.args
        for i, arg in enumerate(params):
            env[arg.arg] = args[i] if i < len(args) else kwargs.get(arg.arg, UNKNOWN)
        try:
            self._run(function.body, env, stem, function, Module(), config)
        except Return as done:
            return done.value
        return None


class DSparkDraftConfig(External):
    """sglang 0.5.23's `parse_dspark_draft_config` (`dspark_config.py`) for a config without the
    `dspark_*` prefixed keys of a bundled draft (draftsmith writes none): DFlash's fields, then
    `markov_rank` and `markov_head_type` from `dflash_config`/`dspark_config`, else the top
    level. Raises as it does for a Markov head without a type or of an unknown type."""

    def __init__(self, draft_hf_config):
        values = draft_hf_config.values
        nested = {**(values.get("dflash_config") or {}), **(values.get("dspark_config") or {})}
        base = DFlashDraftConfig(draft_hf_config)
        self.markov_rank = int(nested.get("markov_rank", values.get("markov_rank", 0)) or 0)
        head = nested.get("markov_head_type", values.get("markov_head_type"))
        if self.markov_rank > 0 and head is None:
            raise ValueError("DSpark requires markov_head_type when markov_rank > 0, got None.")
        if head is not None and str(head).lower() not in MARKOV_HEAD_TYPES:
            raise ValueError(f"Unsupported DSpark markov_head_type={head!r}.")
        self.markov_head_type = None if head is None else str(head).lower()
        self.gamma = base.block_size
        self.mask_token_id = nested.get("mask_token_id", values.get("mask_token_id"))
        self.target_layer_ids = base.target_layer_ids

    def resolve_gamma(self, *, default=None):
        return self.gamma if self.gamma is not None else default

    def require_markov(self) -> bool:
        return self.markov_rank > 0


class RaggedVerifyMode(External):
    """`speculative/ragged_verify.py`'s enum, its members as their string values (compared with
    `is`, as SGLang does: `read_ragged_verify_mode()` returns these very objects)."""

    STATIC, CAP_ACCEPT, COMPACT = RAGGED_VERIFY_MODES


def dspark_externals(ragged_verify_mode: str = "static") -> dict:
    """Stand-ins for what `models/dspark.py` imports from outside models/, with SGLang run under
    `SGLANG_RAGGED_VERIFY_MODE=ragged_verify_mode` (`static`, its default, builds no confidence
    head)."""
    if ragged_verify_mode not in RAGGED_VERIFY_MODES:
        raise ValueError(f"ragged_verify_mode {ragged_verify_mode!r}: one of "
                         f"{RAGGED_VERIFY_MODES}")
    return {**DFLASH_EXTERNALS,
            "parse_dspark_draft_config": lambda draft_hf_config: DSparkDraftConfig(
                draft_hf_config),
            "get_dspark_sample_from_anchor": lambda config: bool(
                config.values.get("sample_from_anchor", True)),
            "read_ragged_verify_mode": lambda: RAGGED_VERIFY_MODES[
                RAGGED_VERIFY_MODES.index(ragged_verify_mode)],
            "RaggedVerifyMode": RaggedVerifyMode()}


def loader_dict(models: SourceModels, stem: str, cls: str, name: str) -> dict:
    """A literal dict a class's methods assign to `name` (e.g. a loader's legacy renames)."""
    node, _ = models._class(cls, stem)
    for item in ast.walk(node):
        if isinstance(item, ast.Assign) and any(getattr(t, "id", "") == name
                                                for t in item.targets):
            return ast.literal_eval(item.value)
    raise KeyError(f"{cls} assigns no {name}")


def load_dflash_backbone(models: SourceModels, params: dict, shards: dict,
                         tensors: dict[str, torch.Tensor]) -> tuple[list[str], set[str]]:
    """SGLang's `DFlashDraftModel.load_weights` on `tensors`: a name resolves as written, without
    or with `model.`, or through its vendor aliases, after its stacked mapping (`.q_proj.` ->
    `qkv_proj` shard q ...); what resolves to nothing is skipped. Returns (problems, the
    parameters loaded)."""
    aliases = loader_dict(models, "dflash", "DFlashDraftModel", "_VENDOR_ENCODER_ALIASES")
    mapping = stacked_params_mapping(models, "dflash", "DFlashDraftModel")

    def resolve(name: str) -> str | None:
        for candidate in (name, name.removeprefix("model."), f"model.{name}",
                          aliases.get(name)):
            if candidate in params:
                return candidate
        return None

    problems, loaded = [], set()
    for name, tensor in tensors.items():
        target, shard = None, None
        for param_name, weight_name, shard_id in mapping:
            if f".{weight_name}." in name:
                target, shard = resolve(name.replace(weight_name, param_name)), shard_id
                break
        else:
            target = resolve(name)
        if target is None:
            problems.append(f"{name}: no parameter (skipped by the loader)")
            continue
        want = params[target] if shard is None else shards[target][shard]
        if tuple(tensor.shape) != tuple(want):
            problems.append(f"{name}: shape {list(tensor.shape)}, {target} needs {list(want)}")
        loaded.add(target)
    return problems, loaded
