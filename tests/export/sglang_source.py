"""SGLang's model classes read from its released package source, never imported: which class an
architecture name builds (`EntryClass`) and which parameters, of which shapes, its `__init__`
declares for a given config.json, found by walking the constructors with a small evaluator over
the config's values. Built for the draft classes (`models/llama_eagle.py` and what it uses):
an expression it cannot evaluate (a TP size, a rotary cache) is unknown, and a layer built from
unknown sizes is an error, never a silent pass.

The wheel (`pip download --no-deps sglang==VERSION`, about 40 MB) is fetched once and its
`sglang/srt/models/*.py` kept under the draftsmith cache."""

from __future__ import annotations

import ast
import contextlib
import math
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SGLANG_VERSION = "0.5.23"
UNKNOWN = object()
# SGLang's parameter-holding layers: positional argument names, defaults (layers/linear.py,
# vocab_parallel_embedding.py, layernorm.py of 0.5.23) and how their weights are shaped.
LINEAR = ("input_size", "output_size", "bias")
LEAVES = {
    "Linear": (("in_features", "out_features", "bias"), {"bias": True}),
    "ReplicatedLinear": (LINEAR, {"bias": True}),
    "ColumnParallelLinear": (LINEAR, {"bias": True}),
    "RowParallelLinear": (LINEAR, {"bias": True}),
    "QKVParallelLinear": (("hidden_size", "head_size", "total_num_heads", "total_num_kv_heads",
                           "bias"), {"bias": True, "total_num_kv_heads": None}),
    "MergedColumnParallelLinear": (("input_size", "output_sizes", "bias"), {"bias": True}),
    "VocabParallelEmbedding": (("num_embeddings", "embedding_dim"), {}),
    "ParallelLMHead": (("num_embeddings", "embedding_dim", "bias"), {"bias": False}),
    "Embedding": (("num_embeddings", "embedding_dim"), {}),
    "RMSNorm": (("hidden_size",), {}),
}


def sglang_models_dir(cache: Path) -> Path:
    """`sglang/srt/models` of the released wheel, downloaded once into `cache`.

    Raises:
        RuntimeError: pip could not download the wheel (its output's tail quoted).
    """
    folder = cache / f"sglang-{SGLANG_VERSION}-models"
    if (folder / "llama_eagle.py").is_file():
        return folder
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                               "--disable-pip-version-check", "-d", scratch,
                               f"sglang=={SGLANG_VERSION}"], capture_output=True, text=True)
        wheels = list(Path(scratch).glob("sglang-*.whl"))
        if done.returncode != 0 or not wheels:
            raise RuntimeError((done.stdout + done.stderr).strip()[-400:])
        partial = folder.with_name(folder.name + ".partial")
        partial.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in wheel.namelist():
                if name.startswith("sglang/srt/models/") and name.count("/") == 3:
                    (partial / Path(name).name).write_bytes(wheel.read(name))
        partial.replace(folder)
    return folder


class Config:
    """config.json as the model classes see it (`config.x`, `getattr(config, "x", d)`)."""

    def __init__(self, values: dict):
        self.values = values


class Module:
    """A constructed module: its own parameters (name -> shape; loading shards) and children,
    and the class it was built from (for its methods and class attributes)."""

    def __init__(self, cls: tuple | None = None):
        self.params: dict[str, tuple[int, ...]] = {}
        self.shards: dict[str, dict] = {}
        self.children: dict[str, Module] = {}
        self.attrs: dict[str, object] = {}
        self.cls = cls  # (ast.ClassDef, file stem)

    def named_parameters(self, prefix: str = "") -> dict[str, tuple[int, ...]]:
        found = {prefix + k: v for k, v in self.params.items()}
        for name, child in self.children.items():
            found.update(child.named_parameters(f"{prefix}{name}."))
        return found

    def named_shards(self, prefix: str = "") -> dict[str, dict]:
        found = {prefix + k: v for k, v in self.shards.items()}
        for name, child in self.children.items():
            found.update(child.named_shards(f"{prefix}{name}."))
        return found


class ClassRef:
    """A class used as a value (`norm_cls = RMSNorm`, a class attribute `attention_cls`)."""

    def __init__(self, name: str, stem: str):
        self.name, self.stem = name, stem


class Return(Exception):
    def __init__(self, value=None):
        super().__init__()
        self.value = value


class SourceModels:
    """The parsed `models/*.py` files and a constructor walker over them."""

    def __init__(self, models_dir: Path, externals: dict | None = None):
        """`externals`: functions the model files import from outside models/ (e.g. a config
        parser), as Python callables standing in for them."""
        self.trees = {p.stem: ast.parse(p.read_text()) for p in models_dir.glob("*.py")}
        self.externals = dict(externals or {})

    def entry_classes(self) -> dict[str, str]:
        """Architecture name -> the file (stem) whose `EntryClass` lists it."""
        found = {}
        for stem, tree in self.trees.items():
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
                    value = node.value
                    names = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
                    found.update({n.id: stem for n in names if isinstance(n, ast.Name)})
        return found

    def _class(self, name: str, stem: str, skip_local: bool = False) -> tuple[ast.ClassDef, str]:
        tree = self.trees[stem]
        if not skip_local:
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and node.name == name:
                    return node, stem
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "sglang.srt.models."):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self._class(alias.name, node.module.rsplit(".", 1)[1])
        raise KeyError(name)

    def has_class(self, name: str, stem: str) -> bool:
        try:
            self._class(name, stem)
            return True
        except KeyError:
            return False

    def construct(self, name: str, stem: str, config: Config, args=(), kwargs=None) -> Module:
        """The module `name` of file `stem` builds for these arguments."""
        node, where = self._class(name, stem)
        module = Module((node, where))
        self._run_init(node, where, module, config, list(args), dict(kwargs or {}))
        return module

    def _method(self, cls: tuple, name: str):
        """(method FunctionDef, its class, stem) along the first-base chain, or None."""
        node, stem = cls
        while node is not None:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item, node, stem
            base = self._base(node, stem)
            node, stem = base if base is not None else (None, None)
        return None

    def _class_attr(self, module: Module, name: str):
        """A class-body assignment `name = ...` of the module's class or its first bases."""
        if module.cls is None:
            return UNKNOWN
        node, stem = module.cls
        while node is not None:
            for item in node.body:
                if isinstance(item, ast.Assign) and any(
                        getattr(t, "id", "") == name for t in item.targets):
                    return self._eval(item.value, {"self": module}, stem)
            base = self._base(node, stem)
            node, stem = base if base is not None else (None, None)
        return UNKNOWN

    def _call_method(self, module: Module, name: str, args, kwargs, config):
        found = self._method(module.cls, name) if module.cls else None
        if found is None:
            return UNKNOWN
        func, cls, stem = found
        env = {"self": module, "config": config}
        params = func.args.args[1:]
        for i, arg in enumerate(params):
            env[arg.arg] = args[i] if i < len(args) else kwargs.get(arg.arg, UNKNOWN)
        try:
            self._run(func.body, env, stem, cls, module, config)
        except Return as done:
            return done.value
        return None

    def _run_init(self, node: ast.ClassDef, stem: str, module: Module, config, args, kwargs):
        if module.cls is None:
            module.cls = (node, stem)
        init = next((f for f in node.body if isinstance(f, ast.FunctionDef)
                     and f.name == "__init__"), None)
        if init is None:  # inherited
            base = self._base(node, stem)
            if base is not None:
                self._run_init(*base, module, config, args, kwargs)
            return
        env = {"self": module, "config": config}
        params = init.args.args[1:]
        defaults = init.args.defaults
        for i, arg in enumerate(params):
            if i < len(args):
                env[arg.arg] = args[i]
            elif arg.arg in kwargs:
                env[arg.arg] = kwargs[arg.arg]
            elif i >= len(params) - len(defaults):
                env[arg.arg] = self._eval(defaults[i - len(params) + len(defaults)], env, stem)
        for arg in init.args.kwonlyargs:
            env[arg.arg] = kwargs.get(arg.arg, UNKNOWN)
        with contextlib.suppress(Return):
            self._run(init.body, env, stem, node, module, config)

    def _base(self, node: ast.ClassDef, stem: str):
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id not in ("Module", "object"):
                return self._class(base.id, stem, skip_local=base.id == node.name)
        return None

    def _run(self, body, env, stem, cls, module, config):
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                func = stmt.value.func
                if (isinstance(func, ast.Attribute) and func.attr == "__init__"
                        and isinstance(func.value, ast.Call)
                        and getattr(func.value.func, "id", "") == "super"):
                    base = self._base(cls, stem)
                    if base is not None:
                        args = [self._eval(a, env, stem) for a in stmt.value.args]
                        kwargs = {k.arg: self._eval(k.value, env, stem)
                                  for k in stmt.value.keywords}
                        self._run_init(*base, module, config, args, kwargs)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                value = self._eval(stmt.value, env, stem) if stmt.value is not None else UNKNOWN
                for target in targets:
                    if isinstance(target, ast.Name):
                        env[target.id] = value
                    elif isinstance(target, ast.Attribute):
                        # self.x = ..., or a child's: self.self_attn.qkv_proj = ... (EAGLE-3's
                        # first layer replaces its attention's input projection)
                        owner = self._eval(target.value, env, stem)
                        if not isinstance(owner, Module):
                            continue
                        if isinstance(value, Module):
                            owner.children[target.attr] = value
                        else:
                            owner.children.pop(target.attr, None)
                            owner.attrs[target.attr] = value
            elif isinstance(stmt, ast.Delete):
                for target in stmt.targets:
                    if isinstance(target, ast.Attribute):
                        module.children.pop(target.attr, None)
            elif isinstance(stmt, ast.If):
                test = self._eval(stmt.test, env, stem)
                if test is not UNKNOWN:
                    self._run(stmt.body if test else stmt.orelse, env, stem, cls, module, config)
            elif isinstance(stmt, ast.With):
                self._run(stmt.body, env, stem, cls, module, config)
            elif isinstance(stmt, ast.Return):
                raise Return(None if stmt.value is None else self._eval(stmt.value, env, stem))
            elif isinstance(stmt, ast.Raise):
                raise ValueError(f"{cls.name}.__init__ raises for this config (line {stmt.lineno})")

    def _eval(self, node, env, stem):
        ev = lambda n: self._eval(n, env, stem)  # noqa: E731
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id in ("True", "False", "None"):
                return {"True": True, "False": False, "None": None}[node.id]
            if node.id in LEAVES or self.has_class(node.id, stem):
                return ClassRef(node.id, stem)
            return UNKNOWN
        if isinstance(node, ast.Attribute):
            base = ev(node.value)
            if isinstance(base, Config):
                return base.values.get(node.attr, UNKNOWN)
            if isinstance(base, Module):
                if node.attr in base.children:
                    return base.children[node.attr]
                if node.attr in base.attrs:
                    return base.attrs[node.attr]
                return self._class_attr(base, node.attr)
            if isinstance(base, External):
                return getattr(base, node.attr, UNKNOWN)
            return UNKNOWN
        if isinstance(node, ast.Call):
            return self._call(node, env, stem)
        if isinstance(node, ast.List | ast.Tuple):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.ListComp) and len(node.generators) == 1:
            gen = node.generators[0]
            items = ev(gen.iter)
            if items is UNKNOWN or not isinstance(gen.target, ast.Name):
                return UNKNOWN
            return [self._eval(node.elt, {**env, gen.target.id: i}, stem) for i in items]
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {ev(k): ev(v) for k, v in zip(node.keys, node.values, strict=True)}
        if isinstance(node, ast.BoolOp):  # short-circuits as Python does
            for value in node.values[:-1]:
                value = ev(value)
                if value is UNKNOWN:
                    return UNKNOWN
                if bool(value) == isinstance(node.op, ast.Or):
                    return value
            return ev(node.values[-1])
        if isinstance(node, ast.UnaryOp):
            value = ev(node.operand)
            if value is UNKNOWN:
                return UNKNOWN
            return {ast.Not: lambda v: not v, ast.USub: lambda v: -v}[type(node.op)](value)
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
                   ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
                   ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a ** b}
            if UNKNOWN in (left, right) or type(node.op) not in ops:
                return UNKNOWN
            return ops[type(node.op)](left, right)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = ev(node.left), ev(node.comparators[0])
            ops = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
                   ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
                   ast.Lt: lambda a, b: a < b, ast.Gt: lambda a, b: a > b,
                   ast.GtE: lambda a, b: a >= b, ast.LtE: lambda a, b: a <= b}
            if UNKNOWN in (left, right) or type(node.ops[0]) not in ops:
                return UNKNOWN
            return ops[type(node.ops[0])](left, right)
        if isinstance(node, ast.IfExp):
            test = ev(node.test)
            return UNKNOWN if test is UNKNOWN else ev(node.body if test else node.orelse)
        return UNKNOWN

    def _call(self, node: ast.Call, env, stem):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        args = [self._eval(a, env, stem) for a in node.args]
        kwargs = {k.arg: self._eval(k.value, env, stem) for k in node.keywords if k.arg}
        if name == "getattr" and len(args) >= 2 and isinstance(args[0], Config):
            return args[0].values.get(args[1], args[2] if len(args) > 2 else UNKNOWN)
        if name == "hasattr" and len(args) == 2 and isinstance(args[0], Config):
            return args[1] in args[0].values
        if name == "bool" and len(args) == 1 and args[0] is not UNKNOWN:
            return bool(args[0])
        if isinstance(func, ast.Attribute) and name == "get":
            owner = self._eval(func.value, env, stem)
            if isinstance(owner, dict):
                return owner.get(*args)
            return UNKNOWN
        if isinstance(func, ast.Name) and name in self.externals:
            return self.externals[name](*args, **kwargs)
        if isinstance(func, ast.Attribute):
            owner = self._eval(func.value, env, stem)
            if isinstance(owner, External):
                return getattr(owner, name)(*args, **kwargs)
            if isinstance(owner, Module) and isinstance(func.value, ast.Name) \
                    and func.value.id == "self" and name not in owner.children:
                found = self._class_attr(owner, name) if owner.cls else UNKNOWN
                if isinstance(found, ClassRef):
                    return self._construct_ref(found, args, kwargs, env)
                return self._call_method(owner, name, args, kwargs, env["config"])
        if name in ("int", "float", "max", "min", "len", "range", "list") \
                and isinstance(func, ast.Name) and name not in env:
            if any(a is UNKNOWN for a in args):
                return UNKNOWN
            return {"int": int, "float": float, "max": max, "min": min, "len": len,
                    "range": lambda *a: list(range(*a)), "list": list}[name](*args)
        if isinstance(func, ast.Name) and isinstance(env.get(name), ClassRef):
            return self._construct_ref(env[name], args, kwargs, env)
        if name == "ModuleList":
            module = Module()
            module.children = {str(i): m for i, m in enumerate(args[0] if args else [])
                               if isinstance(m, Module)}
            return module
        if name in LEAVES:
            return leaf(name, args, kwargs)
        if name and self.has_class(name, stem):
            return self.construct(name, stem, env["config"], args, kwargs)
        return UNKNOWN

    def _construct_ref(self, ref: ClassRef, args, kwargs, env):
        if ref.name in LEAVES:
            return leaf(ref.name, args, kwargs)
        return self.construct(ref.name, ref.stem, env["config"], args, kwargs)


class External:
    """Base of the Python stand-ins for objects that functions outside models/ return (their
    attributes and methods are read directly by the walker)."""


def leaf(kind: str, args: list, kwargs: dict) -> Module:
    """A parameter-holding SGLang layer: its weight (and bias), and the checkpoint shards a
    stacked layer loads (`q`/`k`/`v`, `0`/`1`) with their shapes.

    Raises:
        ValueError: a size the walker could not evaluate.
    """
    names, defaults = LEAVES[kind]
    given = {**defaults, **dict(zip(names, args, strict=False)), **kwargs}
    values = {n: given.get(n, UNKNOWN) for n in names}
    if any(v is UNKNOWN for v in values.values()):
        raise ValueError(f"{kind}: could not evaluate {values}")
    module = Module()
    if kind == "RMSNorm":
        module.params["weight"] = (values["hidden_size"],)
        return module
    if kind in ("VocabParallelEmbedding", "ParallelLMHead", "Embedding"):
        module.params["weight"] = (values["num_embeddings"], values["embedding_dim"])
        if values.get("bias"):
            module.params["bias"] = (values["num_embeddings"],)
        return module
    if kind == "QKVParallelLinear":
        heads, kv = values["total_num_heads"], values["total_num_kv_heads"] or values[
            "total_num_heads"]
        rows = {"q": heads * values["head_size"], "k": kv * values["head_size"],
                "v": kv * values["head_size"]}
        inputs = values["hidden_size"]
    elif kind == "MergedColumnParallelLinear":
        rows = dict(enumerate(values["output_sizes"]))
        inputs = values["input_size"]
    else:
        rows = {None: values.get("out_features", values.get("output_size"))}
        inputs = values.get("in_features", values.get("input_size"))
    total = math.fsum(rows.values())
    module.params["weight"] = (int(total), inputs)
    module.shards["weight"] = {k: (r, inputs) for k, r in rows.items()}
    if values["bias"]:
        module.params["bias"] = (int(total),)
        module.shards["bias"] = {k: (r,) for k, r in rows.items()}
    return module


def stacked_params_mapping(models: SourceModels, stem: str, cls: str) -> list[tuple]:
    """The `stacked_params_mapping` list a class's weight loader renames checkpoint names by:
    (param name, checkpoint name, shard id)."""
    node, _ = models._class(cls, stem)
    for item in ast.walk(node):
        if isinstance(item, ast.Assign) and any(
                getattr(t, "id", "") == "stacked_params_mapping" for t in item.targets):
            return [tuple(ast.literal_eval(e)) for e in item.value.elts]
    return []


class DFlashDraftConfig(External):
    """What sglang 0.5.23's `parse_dflash_draft_config` (`speculative/dflash_utils.py`, lines
    588-700; outside models/, so not walked) reads from a DFlash config.json: `block_size`,
    `num_target_layers` and `target_layer_ids` from `dflash_config`, else the top level; the
    grouped convolution, candidate selector, Domino projector and attention sinks stay off
    unless `dflash_config` asks for them (draftsmith writes none of them)."""

    def __init__(self, draft_hf_config: Config):
        values = draft_hf_config.values
        flags = values.get("dflash_config") or {}
        pick = lambda key: flags.get(key, values.get(key))  # noqa: E731
        self.block_size, self.num_target_layers = pick("block_size"), pick("num_target_layers")
        self.target_layer_ids = pick("target_layer_ids")
        self.conv_kernel_size = flags.get("conv_kernel_size", 0)
        self.conv_group_size = flags.get("conv_group_size", 0)
        self.projector_type = flags.get("projector_type", "dflash")
        self.is_domino = self.projector_type == "domino"
        self.shift_label = flags.get("shift_label", False)
        self.attention_value_scale = flags.get("attention_value_scale")
        self.attention_sink_bias = bool(flags.get("attention_sink_bias", False))

    def resolve_block_size(self, *, default=None):
        return self.block_size if self.block_size is not None else default

    def resolve_target_layer_ids(self, *, target_num_layers, draft_num_layers=None):
        """The recorded ids (SGLang checks each is below target_num_layers); without them
        SGLang guesses with build_target_layer_ids, which the contract refuses to rely on."""
        if not self.target_layer_ids:
            raise ValueError("no target_layer_ids: SGLang would guess the fused layers")
        if any(not 0 <= i < target_num_layers for i in self.target_layer_ids):
            raise ValueError(f"target_layer_ids {self.target_layer_ids} outside "
                             f"{target_num_layers} target layers")
        return list(self.target_layer_ids)


def is_nemotron_35_draft_config(config: Config) -> bool:
    """sglang 0.5.23's test (`dflash_utils.py` line 461): a Nemotron-3.5 draft ships its own
    embedding (`has_embed_tokens`); draftsmith's never does."""
    if config.values.get("has_embed_tokens"):
        raise ValueError("has_embed_tokens: the Nemotron-3.5 layout is not modelled")
    return False


DFLASH_EXTERNALS = {
    "parse_dflash_draft_config": lambda draft_hf_config: DFlashDraftConfig(draft_hf_config),
    "is_nemotron_35_draft_config": is_nemotron_35_draft_config,
}
