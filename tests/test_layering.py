"""The package's layering, read from the source (ast): no import cycles, the CPU pool and the
routing rules importable on their own, and the environment read in one place.

Every import counts, function-local ones too: a cycle hidden behind a local import is still a
cycle. The standard library is always allowed.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "strata"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

# package -> third-party roots and strata packages it may import (besides the stdlib)
ALLOWED = {
    "strata.cpu": {"numpy", "numba", "llvmlite", "gguf", "strata.quant", "strata.cpu"},
    # each rule's NumPy reference beside its Numba twin
    "strata.routing": {"numpy", "numba", "strata.routing"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports_of(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, node.lineno))
            # `from strata.x import y` may name a submodule y
            out += [(f"{mod}.{a.name}", node.lineno) for a in node.names]
    return out


def internal_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for imp, _ in imports_of(name, path):
            if imp in mods and imp != name and not name.startswith(imp + "."):
                graph[name].add(imp)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_cycle_in_strata():
    cycle = find_cycle(internal_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def allowed(imp: str, rules: set[str]) -> bool:
    root = imp.split(".")[0]
    if root in STDLIB:
        return True
    return any(imp == r or imp.startswith(r + ".") for r in rules)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_it_may(package):
    bad = []
    for name, path in modules().items():
        if name == package or name.startswith(package + "."):
            for imp, line in imports_of(name, path):
                if imp and not allowed(imp, ALLOWED[package]):
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {imp}")
    assert not bad, "\n".join(bad)


def reads_environ(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in ("environ", "getenv", "environb") for a in node.names):
                lines.append(node.lineno)
    return lines


def test_environment_is_read_only_in_config():
    bad = []
    for name, path in modules().items():
        if name == "strata.config":
            continue
        for line in reads_environ(ast.parse(path.read_text())):
            bad.append(f"{path.relative_to(ROOT)}:{line}")
    assert not bad, "os.environ read outside strata/config.py:\n" + "\n".join(bad)


def test_no_python_file_in_strata_over_500_lines():
    sizes = {p: len(p.read_text().splitlines()) for p in sorted(PKG.rglob("*.py"))}
    long = [f"{p.relative_to(ROOT)}: {n}" for p, n in sizes.items() if n > 500]
    assert not long, "\n".join(long)
