"""Windows has no POSIX-only modules: an unguarded `import resource` kept the torch engine from importing there
(the Windows workflow's self-test went through llama.cpp, so nothing noticed). Every import of one in the app's
packages must sit in a `try` that catches ImportError, or under a test of sys.platform / os.name."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
POSIX_ONLY = {"resource", "fcntl", "pwd", "grp", "termios", "tty", "pty", "posix", "syslog", "crypt", "spwd",
              "nis", "readline", "curses", "posixpath"}
PACKAGES = ("engine", "dflash_desktop", "ui")


def _guarded(chain: list[ast.AST]) -> bool:
    for node in chain:
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                names = [handler.type] if not isinstance(handler.type, ast.Tuple) else handler.type.elts
                if handler.type is None or any(isinstance(n, ast.Name) and n.id in ("ImportError",
                                               "ModuleNotFoundError", "Exception") for n in names):
                    return True
        if isinstance(node, ast.If) and any(isinstance(n, ast.Attribute) and n.attr in ("platform", "name")
                                            for n in ast.walk(node.test)):
            return True
    return False


def unguarded_posix_imports(source: str, name: str) -> list[str]:
    found = []

    def visit(node: ast.AST, chain: list[ast.AST]) -> None:
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module.split(".")[0]]
        for module in modules:
            if module in POSIX_ONLY and not _guarded(chain):
                found.append(f"{name}:{node.lineno} imports {module}")
        for child in ast.iter_child_nodes(node):
            visit(child, chain + [node])
    visit(ast.parse(source), [])
    return found


def test_the_scan_finds_an_unguarded_import_and_passes_guarded_ones():
    assert unguarded_posix_imports("import resource\n", "x") == ["x:1 imports resource"]
    assert unguarded_posix_imports("def f():\n    from fcntl import flock\n", "x") == ["x:2 imports fcntl"]
    assert unguarded_posix_imports("try:\n    import resource\nexcept ImportError:\n    resource = None\n", "x") == []
    assert unguarded_posix_imports("import sys\nif sys.platform != 'win32':\n    import pwd\n", "x") == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_posix_only_module_is_imported_unguarded(package):
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        found += unguarded_posix_imports(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not found, "POSIX-only imports that would fail on Windows:\n" + "\n".join(found)
