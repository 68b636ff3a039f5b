"""The house stays layered: the import graph of src/tilepilot, read from the source with ast.

Each top-level package (or root module) belongs to one layer; a module may import only its own layer and the layers
below it, at module level or inside a function. docs/architecture.md describes the same order.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tilepilot"

# bottom to top; a unit in layer i may import units of layers <= i (its own layer only itself: see SAME_LAYER_OK)
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("files", "data", "parallel"),
    ("model",),
    ("oracle", "gates"),
    ("npu",),
    ("kernels",),
    ("plan",),
    ("runtime",),
    ("calibrate", "harness"),
    ("skills",),
    ("serve", "report"),
    ("commands",),
    ("cli",),
    ("__main__",),
]
LAZY_LIMIT = 20  # function-level imports of tilepilot modules, each deferring a heavy optional dependency


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> list[tuple[str, int, bool]]:
    """(imported tilepilot module, line, inside a function) for every import statement of one file."""
    module = module_name(path, root)
    tree = ast.parse(path.read_text())
    inner: set[int] = set()
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner.update(id(n) for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom)))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                targets = [".".join(base + ([node.module] if node.module else []))]
            else:
                targets = [node.module or ""]
            if targets[0] == root.name:  # `from tilepilot import x`: x is the unit
                targets = [f"{root.name}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        out += [(t, node.lineno, id(node) in inner) for t in targets if t.split(".")[0] == root.name]
    return out


def graph(root: Path) -> tuple[dict[str, set[str]], list[str], list[str]]:
    """(unit -> units it imports, upward imports as messages, function-level imports as 'file:line')."""
    layer = {u: i for i, units in enumerate(LAYERS) for u in units}
    edges: dict[str, set[str]] = defaultdict(set)
    upward, lazy = [], []
    for path in sorted(root.rglob("*.py")):
        src_unit = unit_of(module_name(path, root))
        src_unit = path.stem if src_unit == "<root>" else src_unit
        for target, line, in_function in imports_of(path, root):
            dst_unit = unit_of(target)
            if in_function:
                lazy.append(f"{path.relative_to(root)}:{line}")
            if dst_unit == src_unit:
                continue
            edges[src_unit].add(dst_unit)
            if layer.get(dst_unit, -1) > layer.get(src_unit, len(LAYERS)) or (
                layer.get(dst_unit) == layer.get(src_unit)
            ):
                upward.append(f"{path.relative_to(root)}:{line} ({src_unit}) imports {target} ({dst_unit})")
    return edges, upward, lazy


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(edges.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v) :] + [v]
            if v not in state and (c := visit(v)):
                return c
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(edges):
        if u not in state and (c := visit(u)):
            return c
    return None


def test_every_unit_has_a_layer():
    units = {p.stem if p.parent == SRC else p.relative_to(SRC).parts[0] for p in SRC.rglob("*.py")}
    known = {u for layer in LAYERS for u in layer}
    assert units - known - {"__init__"} == set(), "add the new package to LAYERS and docs/architecture.md"


def test_no_package_cycle_and_no_upward_import():
    edges, upward, _ = graph(SRC)
    assert find_cycle(edges) is None
    assert upward == []


def test_few_function_level_imports_each_with_its_reason():
    _, _, lazy = graph(SRC)
    assert len(lazy) < LAZY_LIMIT, lazy
    for where in lazy:
        file, line = where.rsplit(":", 1)
        lines = (SRC / file).read_text().splitlines()
        around = " ".join(lines[int(line) - 2 : int(line)])
        assert "# lazy:" in around, f"{where}: say why this import is deferred with a '# lazy: <reason>' comment"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "tilepilot"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


@pytest.mark.parametrize(
    "files, problem",
    [
        # a cycle: npu <-> kernels, one side through a lazy import
        (
            {
                "npu/__init__.py": "",
                "npu/a.py": "def f():\n    from tilepilot.kernels.b import g\n",
                "kernels/__init__.py": "",
                "kernels/b.py": "from tilepilot.npu.a import f\n",
            },
            "cycle",
        ),
        # an upward import: plan reaching into runtime
        ({"plan/__init__.py": "", "plan/p.py": "from tilepilot.runtime import runner\n"}, "upward"),
        # a sideways import inside one layer (skills -> serve)
        ({"skills/__init__.py": "", "skills/s.py": "import tilepilot.serve.app\n"}, "upward"),
    ],
)
def test_the_checks_catch_what_they_guard(tmp_path, files, problem):
    edges, upward, _ = graph(_tree(tmp_path, files))
    if problem == "cycle":
        assert find_cycle(edges) == ["kernels", "npu", "kernels"]
    assert upward, "an import against the layer order must be reported"
