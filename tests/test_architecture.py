"""The architecture's rules that import-linter cannot state: no package imports another
package's private names or private modules (a leading underscore), and the family packages'
modules keep to their own package and the shared pieces of formats/."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "ckptinspect"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: pathlib.Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(path: pathlib.Path):
    """(imported module, imported name or None, line) for every import statement."""
    package = _package_of(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                yield module, alias.name, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno


def _owner(module: str) -> str:
    """The package a module belongs to for this rule: the module's own package."""
    return module.rpartition(".")[0]


def _private_reach(importer: pathlib.Path) -> list[str]:
    """Private names or modules of another package that ``importer`` imports."""
    mine = _package_of(importer)
    found = []
    for module, name, line in _imports(importer):
        if not module.startswith("ckptinspect"):
            continue
        parts = module.split(".")
        private_at = next((i for i, p in enumerate(parts) if p.startswith("_") and p != "__init__"), None)
        if private_at is not None:
            owner = ".".join(parts[:private_at])
            if not (mine == owner or mine.startswith(owner + ".")):
                found.append(f"{importer.relative_to(PACKAGE.parent)}:{line} imports the private module {module}")
        if name and name.startswith("_") and not name.startswith("__"):
            target_pkg = module if (PACKAGE.parent / module.replace(".", "/")).is_dir() else _owner(module)
            if not (mine == target_pkg or mine.startswith(target_pkg + ".")):
                found.append(f"{importer.relative_to(PACKAGE.parent)}:{line} imports the private name {module}.{name}")
    return found


def test_no_package_imports_another_packages_private_names():
    problems = [p for path in sorted(PACKAGE.rglob("*.py")) for p in _private_reach(path)]
    assert not problems, "\n".join(problems)


def test_the_rule_sees_a_private_import(tmp_path):
    """The check above can fail: a module of ops importing a private name of formats."""
    fake = PACKAGE / "ops" / "_architecture_probe.py"
    fake.write_text("from ..formats._fs import read_head\nfrom ..formats.tf.bundle import _entry_damage\n")
    try:
        found = _private_reach(fake)
    finally:
        fake.unlink()
    assert len(found) == 2, found
