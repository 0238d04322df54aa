"""The import graph of engine/, dflash_desktop/ and ui/: no cycles (an import inside a function counts, as it
runs sooner or later), dependencies point one way (ui -> dflash_desktop -> engine), and the linter the code's
noqa comments assume passes. Read from the source with ast: nothing is imported."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "dflash_desktop", "ui")
LAYER = {"ui": 2, "dflash_desktop": 1, "engine": 0}    # a module imports only from its layer or those below
# The app's entry point opens the window, so it imports ui: the one module that composes every layer.
COMPOSITION_ROOT = "dflash_desktop.__main__"


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            if "patches" in path.relative_to(root).parts:     # llama.cpp's sources we patch, not ours
                continue
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that `name` imports anywhere in its file (importing a.b.c also runs a and a.b)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known
    found.discard(name)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = modules(root)
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{name} -> {target}" for name, targets in edges.items() for target in targets
                  if name != COMPOSITION_ROOT and LAYER[target.split(".")[0]] > LAYER[name.split(".")[0]])


def test_no_import_cycles():
    edges = graph()
    assert "engine.backends.torch.eager" in edges and "ui.main_window" in edges     # the walk found the tree
    assert cycles(edges) == []


def test_dependencies_point_one_way():
    edges = graph()
    assert "ui.app" in edges[COMPOSITION_ROOT]
    assert upward(edges) == []
    # the root sits above every layer: no module imports it (installers/entry.py and `-m` run it)
    assert [name for name, targets in edges.items() if COMPOSITION_ROOT in targets] == []


def test_engines_and_the_loop_meet_only_at_the_contract():
    """Engines never import the loop, and the loop imports no engine: both know engine/backends/__init__.py."""
    edges = graph()
    engines = [name for name in edges if name.startswith("engine.backends.")]
    assert "engine.backends.torch.cuda" in engines
    assert [name for name in engines if "engine.loop" in edges[name]] == []
    assert [t for t in edges["engine.loop"] if t.startswith("engine.backends.")] == []


def test_the_checks_catch_a_cycle_and_an_upward_import(tmp_path):
    """The same checks on a small tree with a lazy cycle and an engine module that imports the window."""
    files = {"engine/__init__.py": "", "engine/a.py": "from . import b\n",
             "engine/b.py": "def later():\n    from .a import x\n",
             "engine/c.py": "from ui import window\n", "engine/d.py": "def later():\n    from . import e\n",
             "engine/e/__init__.py": "from ..d import later\n", "dflash_desktop/__init__.py": "",
             "ui/__init__.py": "", "ui/window.py": "import engine.c\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    edges = graph(tmp_path)
    assert ["engine.a", "engine.b"] in cycles(edges)
    assert ["engine.c", "ui.window"] in cycles(edges)
    assert ["engine.d", "engine.e"] in cycles(edges)       # a package and a module that imports it back
    assert "engine.c -> ui.window" in upward(edges) and "engine.c -> ui" in upward(edges)


def test_linter_passes():
    """pyproject.toml's [tool.ruff]: the rules the code's noqa comments name."""
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
