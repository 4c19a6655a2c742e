"""The import graph of equivci (docs/architecture.md): no cycles, and imports flow one way along the
pipeline. Read from the source with `ast`, so function-local, TYPE_CHECKING and
`importlib.import_module("equivci....")` imports count as much as top-level ones."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "equivci"

# Lowest first: a module may import from its own layer and the layers before it. A module belongs
# to the layer of the longest prefix of its name listed here.
LAYERS: list[tuple[str, ...]] = [
    ("equivci", "equivci.errors", "equivci.results", "equivci.timings", "equivci.options", "equivci.cache"),
    ("equivci.manifest",),
    ("equivci.git", "equivci.gitdiff", "equivci.ci.diff"),  # the git module (diff parsing included)
    ("equivci.hlo",),  # the HLO parser: a leaf, which capture uses to read HLO files (kind: hlo)
    ("equivci.capture",),
    ("equivci.workspace", "equivci.memo"),
    ("equivci.terms",),
    ("equivci.layers",),
    ("equivci.translate",),
    ("equivci.prove",),
    ("equivci.diagnose",),
    ("equivci.verify",),
    ("equivci.pipeline", "equivci.shard"),
    ("equivci.report",),
    ("equivci.ci",),
    ("equivci.commands", "equivci.cli", "equivci.__main__", "equivci.testing"),
]

# Known exceptions, each with the change that removes it.
ALLOWED: dict[tuple[str, str], str] = {
    ("equivci.capture.child", "equivci.memo"): "the capture child should import its key functions from equivci.cache",
}


def module_names() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The equivci module `target` names (a module, or a name inside one)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]
        for target in targets:
            if target == "equivci" or target.startswith("equivci."):
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != name:
                    found.add(resolved)
    return found


def graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def layer_of(name: str) -> int:
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f"{name} is in no layer: add it to LAYERS (and to docs/architecture.md)"
    return best


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_every_kind_of_import() -> None:
    edges = graph()
    assert "equivci.verify.engine" in edges["equivci.pipeline"]  # importlib.import_module, in a function
    assert "equivci.terms.ir" in edges["equivci.layers.segments"]  # top level
    assert "equivci.translate.evaluator" in edges["equivci.translate.programs"]


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_imports_flow_one_way_along_the_pipeline() -> None:
    edges = graph()
    upward = sorted(
        f"{src} (layer {layer_of(src)}) imports {dst} (layer {layer_of(dst)})"
        for src, targets in edges.items() for dst in targets
        if layer_of(dst) > layer_of(src) and (src, dst) not in ALLOWED
    )
    assert upward == []


def test_allowed_exceptions_still_exist() -> None:
    edges = graph()
    assert [pair for pair in ALLOWED if pair[1] not in edges.get(pair[0], ())] == []


def unexplained_local_imports(source: str, filename: str) -> list[int]:
    """Lines of function-local imports that carry no `# lazy: why` comment: on their line, on the
    line above, or over the block of consecutive imports they continue."""
    lines = source.splitlines()
    local = sorted(
        node.lineno
        for fn in ast.walk(ast.parse(source, filename))
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(fn)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    )
    explained: set[int] = set()
    for lineno in local:
        line, above = lines[lineno - 1], lines[lineno - 2].strip() if lineno > 1 else ""
        if "# lazy:" in line or above.startswith("# lazy:") or lineno - 1 in explained:
            explained.add(lineno)
    return [n for n in local if n not in explained]


def test_the_local_import_check_finds_an_unexplained_import() -> None:
    source = (
        "def f():\n    # lazy: heavy\n    import a\n    import b\n\n    import c\n"
        "def g():\n    import d  # lazy: heavy\n"
    )
    assert unexplained_local_imports(source, "x.py") == [6]


def test_every_function_local_import_says_why() -> None:
    """Imports belong at the top of their module; one inside a function stays only with a reason (a
    heavy module the CLI's fast paths must not pay for, a cycle) in a `# lazy:` comment."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for lineno in unexplained_local_imports(path.read_text(), str(path))
    ]
    assert found == []
