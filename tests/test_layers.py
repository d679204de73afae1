"""The package's rooms form layers: every import runs to the same layer or one below it, and no
two modules import each other, directly or around a circle.

Layers, bottom to top (a room is a module of `draftsmith/` or a package of it):

  0  errors, files, config_values, provenance,       plain utilities
     host_memory
  1  process_group                                    leaving a multi-process run
  2  models, draft_vocab                              nn.Modules, pure losses, target features;
                                                      the draft vocabulary (drafters share it)
  3  registry, target, drafter_folder                 drafter kinds; the target (loading, its
                                                      precision, offline models, int8 copies,
                                                      chat replies); loading drafters
  4  decoding                                         the lossless decoding engine
  5  engines, llama_cpp                               vLLM and llama.cpp processes; llama.cpp's
                                                      converter and target GGUF checks
  6  data, export                                     data preparation; serving formats
  7  train, eval                                      training; the evaluation harness
  8  serving, bench, plan                             serve-check; the benchmark; memory plans
  9  cli, __main__                                    commands

Imports inside a function count too: a late import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import draftsmith

PACKAGE = Path(draftsmith.__file__).parent
LAYERS = [
    ("errors", "files", "config_values", "provenance", "recipes_index", "host_memory"),
    ("process_group",),
    ("models", "draft_vocab"),
    ("registry", "target", "drafter_folder"),
    ("decoding",),
    ("engines", "llama_cpp"),
    ("data", "export"),
    ("train", "eval"),
    ("serving", "bench", "plan"),
    ("cli", "__main__"),
]
LAYER_OF = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the draftsmith modules it imports (anywhere in its body)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_room_has_a_layer():
    rooms = {_room(m) for m in _imports()} - {None, "__init__"}
    assert rooms <= set(LAYER_OF), f"rooms without a layer: {sorted(rooms - set(LAYER_OF))}"


def test_no_import_runs_up_a_layer():
    upward = sorted(f"{a} -> {b} (layer {LAYER_OF[_room(a)]} -> {LAYER_OF[_room(b)]})"
                    for a, targets in _imports().items() if _room(a) in LAYER_OF
                    for b in targets if _room(b) in LAYER_OF
                    and LAYER_OF[_room(b)] > LAYER_OF[_room(a)])
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_no_import_cycle():
    graph = _imports()
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join([*stack[stack.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
