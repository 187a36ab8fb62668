"""The layout's rules, read off the source (ARCHITECTURE.md, "Import directions"): no import circle in logfs/ or
tools/, each storage subpackage imports only the ones below it, the engine imports neither pyfuse3 nor trio, and
tools never import the test suite."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Lower rank first; a module may import its own rank or lower. Ranks name dotted prefixes, longest match wins.
RANKS = [
    ("logfs._speedups", 0),
    ("logfs.remote", 0),
    ("logfs.storage.errors", 1), ("logfs.storage.clock", 1), ("logfs.storage.names", 1),
    ("logfs.storage.counters", 1), ("logfs.storage.checkpoints", 1), ("logfs.storage.failure", 1),
    ("logfs.storage.format", 2),
    ("logfs.storage.config", 3),
    ("logfs.storage.local", 4),
    ("logfs.storage.cleaner", 5), ("logfs.storage.publish", 5),
    ("logfs.storage.tiered", 6),
    ("logfs.storage.manager", 7), ("logfs.storage", 7),
    ("logfs.view", 8), ("logfs.spark", 8), ("logfs.tools", 8),
    ("logfs.fuse", 9),
    ("logfs.service", 10),
    ("logfs.cli", 11),
    ("logfs.testing", 12),  # the rig of the tests and benches: may import all of logfs, imported by none of it
    ("logfs", 0),
]


def _rank(module: str) -> int:
    best = max((p for p, _ in RANKS if module == p or module.startswith(p + ".")), key=len)
    return dict(RANKS)[best]


def _modules(top: str, package: str | None) -> dict[str, str]:
    """Dotted name -> path for every .py under ``top`` (flat names for tools/, which runs as scripts)."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, ROOT if package else os.path.join(ROOT, top))[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def _imports(module: str, path: str, known: dict[str, str]) -> set[str]:
    """Modules of ``known`` that ``module`` imports, anywhere in it (functions included)."""
    tree = ast.parse(open(path).read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _graph(top: str, package: str | None) -> dict[str, set[str]]:
    known = _modules(top, package)
    return {m: _imports(m, p, known) for m, p in known.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports in ``graph`` (a package's ``__init__`` importing its own modules is not one)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if m.startswith(n + "."):  # a module importing its own package's __init__
                continue
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_circle_in_logfs():
    assert _cycle(_graph("logfs", "logfs")) is None


def test_no_import_circle_in_tools():
    assert _cycle(_graph("tools", None)) is None


def test_imports_go_down_the_layers():
    graph = _graph("logfs", "logfs")
    wrong = [f"{m} -> {n}" for m, deps in sorted(graph.items()) for n in sorted(deps)
             if _rank(n) > _rank(m) and not m.startswith(n + ".")]
    assert not wrong, wrong


def test_engine_imports_neither_fuse_nor_trio():
    for module, path in _modules("logfs/storage", "logfs").items():
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.split(".")[0] in ("pyfuse3", "trio")], (module, names)


def test_tools_never_import_the_tests():
    for module, path in _modules("tools", None).items():
        for node in ast.walk(ast.parse(open(path).read())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.split(".")[0] in ("tests", "conftest")], (module, names)


def test_tests_and_tools_never_edit_sys_path():
    """Tests and tools import the rig as ``logfs.testing.<module>``; a process that must run another checkout's code
    gets PYTHONPATH in its environment."""
    edits = []
    for top in ("tests", "tools"):
        for module, path in _modules(top, None).items():
            for node in ast.walk(ast.parse(open(path).read())):
                target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    else node.targets[0].value if isinstance(node, ast.Assign) and isinstance(
                        node.targets[0], ast.Subscript) else None
                if ast.unparse(target or ast.Constant(None)) == "sys.path":
                    edits.append(f"{top}/{module}:{node.lineno}")
    assert not edits, edits


def test_one_module_imports_the_c_accelerator():
    """logfs.storage.format.speedups is the one import of logfs._speedups (everything else asks it)."""
    importers = []
    for module, path in _modules("logfs", "logfs").items():
        for node in ast.walk(ast.parse(open(path).read())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] + [a.name for a in node.names] if isinstance(node, ast.ImportFrom)
                     else [])
            if any(n.rpartition(".")[2] == "_speedups" for n in names):
                importers.append(module)
    assert importers == ["logfs.storage.format.speedups"]
