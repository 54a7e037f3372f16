"""Data flows one way: lower layers never import higher ones."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# layer of each module or room (lower number = lower layer); a module may import only its
# own layer or lower ones. The rooms of tv_ir/ are the layers: ir/ (the program and its
# import), xla/ (bridges to XLA), passes (normalisation), semantics/ (algebras, terms, the op
# table, interpreters, layouts), prover/ and report/, then the drivers at the top.
LAYERS = {
    # shared ground
    "tv_ir.errors": 0,
    "tv_ir.limits": 0,
    "tv_ir.report.verdicts": 0,
    # ir/: the program, its attributes, reading it
    "tv_ir.ir": 0,
    "tv_ir.ir.importer": 1,
    # xla/: XLA's partitioner, Shardy's passes, XLA's per-pass dumps (all read through ir/)
    "tv_ir.xla": 1,
    # passes/: IR-to-IR rewrites
    "tv_ir.passes": 2,
    "tv_ir.passes.unroll": 3,  # evaluates trip counts with the interpreter
    "tv_ir.passes.loop_cut": 3,  # folds trip counts and layer indices (passes.unroll)
    "tv_ir.passes.loop_shorten": 3,  # reads passes.loop_cut's loops
    "tv_ir.passes.shape_reduction": 3,  # folds per-device offsets with the concrete op table
    "tv_ir.passes.stack_writes": 3,  # folds layer starts with the concrete op table
    "tv_ir.passes.mesh_reduction": 3,  # reads dimension classes with shape reduction's rules
    # semantics/: what programs mean
    "tv_ir.semantics": 3,
    "tv_ir.semantics.layout": 1,  # read by the importer's boundary checks and by passes
    "tv_ir.semantics.interpreters.mesh_coords": 1,
    "tv_ir.semantics.reduction_order": 4,  # reads a reduction's body with the evaluator
    # prover/ and report/
    "tv_ir.report": 4,  # result types the prover returns, and their rendering
    "tv_ir.prover": 4,
    "tv_ir.prover.boundary_layouts": 5,  # where a per-device program's values live
    # drivers
    "tv_ir.pipeline": 6,
    "tv_ir.pass_validation": 6,  # tv passes: each snapshot against a proved one
    "tv_ir.suite": 7,  # many pairs: workers, the result cache, JUnit
    "tv_ir.pytest_plugin": 7,
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


def test_every_module_has_a_layer() -> None:
    """A new module is placed in a room (or named here): the top level holds only drivers."""
    top = {"tv_ir", "tv_ir.errors", "tv_ir.limits", "tv_ir.pipeline", "tv_ir.pass_validation"}
    top |= {"tv_ir.suite", "tv_ir.pytest_plugin", "tv_ir.cli", "tv_ir.examples"}
    flat = [
        name
        for name, _, _ in _modules()
        if name.startswith("tv_ir.")
        and name.count(".") == 1
        and name not in top
        and name not in ("tv_ir.passes", "tv_ir.frontends")
        and not (ROOT / "tv_ir" / name.split(".")[1]).is_dir()
    ]
    assert not flat, f"modules outside tv_ir's rooms: {flat}"


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
