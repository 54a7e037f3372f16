"""Data flows one way: lower layers never import higher ones."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# layer of each module (lower number = lower layer); a module may import only its own
# layer or lower ones
LAYERS = {
    "tv_ir.errors": 0,
    "tv_ir.ir": 0,
    "tv_ir.attrs": 0,
    "tv_ir.limits": 0,
    "tv_ir.quantized_types": 0,  # quantized types in program text, rewritten before parsing
    "tv_ir.sources": 0,  # whose code a source file is (tv's, a library's, the user's)
    "tv_ir.mesh_coords": 1,
    "tv_ir.closeness": 3,
    "tv_ir.importer": 1,
    "tv_ir.partitioner": 1,
    "tv_ir.shardy_passes": 1,
    "tv_ir.layout": 1,
    "tv_ir.passes": 2,
    "tv_ir.ops": 3,
    "tv_ir.algebra": 3,
    "tv_ir.terms": 3,
    "tv_ir.symbolic": 3,
    "tv_ir.interp": 3,
    "tv_ir.passes.unroll": 3,  # evaluates trip counts with the interpreter
    "tv_ir.passes.loop_cut": 3,  # folds trip counts and layer indices (passes.unroll)
    "tv_ir.passes.loop_shorten": 3,  # reads passes.loop_cut's loops
    "tv_ir.passes.shape_reduction": 3,  # folds per-device offsets with the concrete op table
    "tv_ir.spmd": 3,
    "tv_ir.process_grid": 3,
    "tv_ir.verdicts": 0,
    "tv_ir.evaluator": 3,
    "tv_ir.report": 4,
    "tv_ir.report_text": 4,  # result types the prover returns, and their rendering
    "tv_ir.prover": 4,
    "tv_ir.reduction_order": 4,  # reads a reduction's body with the concrete evaluator
    "tv_ir.boundary_layouts": 5,  # where a per-device program's values live
    "tv_ir.pipeline": 6,
    "tv_ir.suite": 7,  # many pairs: workers, the result cache, JUnit
    "tv_ir.pytest_plugin": 7,
    "tv_ir.xla_dumps": 1,  # reading XLA's per-pass dump directories
    "tv_ir.pass_validation": 6,  # tv passes: each snapshot against a proved one
    "tv_ir.cli": 7,
    "tv_ir": 7,
    "tv_ir.frontends": 8,
}


def _layer(module: str) -> int | None:
    best = None
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best[0])
        ):
            best = (prefix, layer)
    return best[1] if best else None


def _modules():
    for base, package in [
        (ROOT / "tv_ir", "tv_ir"),
        (ROOT / "passes", "tv_ir.passes"),
        (ROOT / "frontends", "tv_ir.frontends"),
    ]:
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield ".".join([package, *parts]), path, path.name == "__init__.py"


def _imports(name: str, path: Path, is_pkg: bool):
    tree = ast.parse(path.read_text())
    pkg = name if is_pkg else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not node.module:
                for a in node.names:
                    yield f"{mod}.{a.name}"
            else:
                yield mod


def test_imports_point_down() -> None:
    bad = []
    for name, path, is_pkg in _modules():
        own = _layer(name)
        if own is None or name == "tv_ir":
            continue
        for imported in _imports(name, path, is_pkg):
            if not imported.startswith("tv_ir"):
                continue
            other = _layer(imported)
            if other is not None and other > own:
                bad.append(f"{name} (layer {own}) imports {imported} (layer {other})")
    assert not bad, "\n".join(bad)


def test_z3_lives_in_one_module() -> None:
    users = [p.name for p in (ROOT / "tv_ir").rglob("*.py") if "import z3" in p.read_text()]
    assert users == ["smt.py"]


def test_no_import_cycles() -> None:
    """No module imports another that imports it back, directly or through others, even
    inside a function (a lazy import only hides the cycle)."""
    modules = {name: (path, is_pkg) for name, path, is_pkg in _modules()}
    graph = {
        name: {m for m in _imports(name, path, is_pkg) if m in modules and m != name}
        for name, (path, is_pkg) in modules.items()
    }
    # a package's __init__ importing its own submodules is how packages are made: skip it
    graph = {
        n: {m for m in deps if not (modules[n][1] and m.startswith(n + "."))}
        for n, deps in graph.items()
    }
    cycles = []
    state: dict[str, int] = {}

    def visit(n, stack):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycles.append(" -> ".join(stack[stack.index(m) :] + [m]))
            elif m not in state:
                visit(m, stack)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [])
    assert not cycles, "\n".join(cycles)
