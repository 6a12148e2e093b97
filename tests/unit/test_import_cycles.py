"""No import cycle among the client distribution's modules (the pod code, the engines, the
formats, the contract, the commands), lazy imports (inside functions) counted: a module that
needs another only inside a function still depends on it, so a cycle closed by a lazy import is
a cycle. Read from the sources with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import ROOT

SOURCE_ROOTS = (ROOT / "client",)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(root, path): path for root in SOURCE_ROOTS for path in (root / "tunecache").rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The tunecache modules ``name`` imports anywhere in its source (``from a import b`` is
    ``a.b`` where that is a module, else ``a``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {module for module in found if module in known and module != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_module_imports_itself_back_lazy_imports_counted():
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    # a package's __init__ importing its own submodules is how packages are built, not a cycle
    graph = {name: {m for m in deps if not (m.startswith(name + ".") or name.startswith(m + "."))}
             for name, deps in graph.items()}
    assert "tunecache.client.install" in graph and graph["tunecache.client.install"], "the imports were not read"
    assert cycles(graph) == []


def test_the_check_sees_a_cycle_closed_by_a_lazy_import(tmp_path):
    """The check can fail: two modules, one importing the other inside a function."""
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    import a\n")
    known = {"a", "b"}
    graph = {name: _imports(name, tmp_path / f"{name}.py", known) for name in known}
    assert cycles(graph) == [["a", "b"]]
