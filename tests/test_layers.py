"""The dependency rule, read from every module's imports (AST; nothing is imported or run).

Each top-level folder is one part and holds its import path (`trainer/lightning_otel/trainer/...`).
Parts sit in layers; a module may import its own part and the parts of lower layers, never a part of
its own layer or above. No module imports another module's underscore names (a package may use its
own private submodules, e.g. compiled helpers). The README's "Layout" section states the same rule.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# part folder -> (layer, the import prefixes it owns)
PARTS = {
    "core": (0, ("lightning_otel.core",)),
    "instrument": (1, ("lightning_otel.instrumentation", "lightning_otel")),
    "gateway": (1, ("lightning_otel.gateway",)),
    "collector": (1, ("lightning_otel.collector",)),
    "trainer": (2, ("lightning_otel.trainer",)),
    "dashboards": (2, ("lightning_otel.dashboards",)),
    "cli": (3, ("lightning_otel.cli", "lightning_otel.__main__")),
    # The development harness: above every product part, so none may import it; tests, bench,
    # examples and docs scripts do.
    "testing": (4, ("lightning_otel.testing",)),
}
PRODUCT_PARTS = [part for part in PARTS if part != "testing"]
EXAMPLES_LAYER = 5  # examples/ may use every part and the harness; nothing imports an example


def part_of_module(module: str) -> str | None:
    """The part that owns a dotted module name (the longest matching prefix wins)."""
    best, length = None, -1
    for part, (_, prefixes) in PARTS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = part, len(prefix)
    return best


def module_name(path: Path) -> str:
    """`trainer/lightning_otel/trainer/update.py` -> `lightning_otel.trainer.update`."""
    parts = path.relative_to(ROOT).with_suffix("").parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_sources() -> list[tuple[str, Path]]:
    return [(part, path) for part in PARTS for path in sorted((ROOT / part / "lightning_otel").rglob("*.py"))]


def example_sources() -> list[Path]:
    return sorted((ROOT / "examples").rglob("*.py"))


def imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, imported names) for every import statement, relative ones resolved."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            found.append((node.lineno, base, [alias.name for alias in node.names]))
    return found


def is_module(dotted: str) -> bool:
    """Whether a dotted name is a module or package of this repository (a file or folder). A C
    extension counts by its source (`_name.c`), built or not: the answer must not depend on whether
    the extensions were compiled in place."""
    part = part_of_module(dotted)
    if part is None:
        return False
    path = ROOT / part / Path(*dotted.split("."))
    return path.with_suffix(".py").exists() or path.is_dir() or path.with_suffix(".c").exists()


def violations(importer_part: str | None, layer: int, path: Path, module: str) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    where = path.relative_to(ROOT)
    problems = []
    for line, target, names in imports(tree, module, is_package):
        if not target.startswith("lightning_otel"):
            continue
        targets = [target] + [f"{target}.{n}" for n in names if is_module(f"{target}.{n}")]
        for dotted in targets:
            part = part_of_module(dotted)
            if part is None:
                problems.append(f"{where}:{line}: {dotted} is no module of any part")
            elif part != importer_part and PARTS[part][0] >= layer:
                problems.append(
                    f"{where}:{line}: {importer_part or 'examples'} (layer {layer}) imports "
                    f"{dotted} ({part}, layer {PARTS[part][0]})"
                )
        own_package = module if is_package else module.rpartition(".")[0]
        for name in names:
            private = name.startswith("_") and not name.startswith("__")
            sibling_module = target == own_package and is_module(f"{target}.{name}")
            if private and not sibling_module:
                problems.append(f"{where}:{line}: imports {target}.{name}, another module's private name")
        private_module = any(piece.startswith("_") and not piece.startswith("__") for piece in target.split("."))
        if private_module and target.rpartition(".")[0] != own_package:
            problems.append(f"{where}:{line}: imports private module {target}")
    return problems


@pytest.mark.parametrize("part", sorted(PARTS))
def test_each_part_imports_only_itself_and_lower_layers(part):
    layer = PARTS[part][0]
    problems = []
    for owner, path in part_sources():
        if owner == part:
            problems += violations(part, layer, path, module_name(path))
    assert not problems, "\n".join(problems)


def test_examples_use_parts_only_through_their_public_modules():
    problems = []
    for path in example_sources():
        problems += violations(None, EXAMPLES_LAYER, path, path.stem)
    assert not problems, "\n".join(problems)


def imported_parts(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, part) for every import of a repository module in the file at path."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for line, target, names in imports(tree, module, path.name == "__init__.py"):
        for dotted in [target] + [f"{target}.{n}" for n in names]:
            part = part_of_module(dotted) if target.startswith("lightning_otel") else None
            if part is not None:
                found.append((line, part))
    return found


def test_no_product_part_imports_the_testing_part():
    """The harness sits above every product part; a product module that reaches into it (even
    lazily, inside a function) would make the product depend on test code."""
    assert PARTS["testing"][0] > max(PARTS[part][0] for part in PRODUCT_PARTS)
    importers = [
        f"{path.relative_to(ROOT)}:{line}"
        for part, path in part_sources()
        if part != "testing"
        for line, imported in imported_parts(path, module_name(path))
        if imported == "testing"
    ]
    assert not importers, "product modules import lightning_otel.testing:\n" + "\n".join(importers)


def test_every_module_lives_where_its_import_name_says():
    """A reader finds `lightning_otel.<part>.x` at `<folder>/lightning_otel/<part>/x.py`."""
    misplaced = [
        f"{path.relative_to(ROOT)} is {module_name(path)}, owned by {part_of_module(module_name(path))}"
        for part, path in part_sources()
        if part_of_module(module_name(path)) != part
    ]
    assert not misplaced, "\n".join(misplaced)


def test_the_rule_catches_what_it_should(tmp_path, monkeypatch):
    """The checker itself: an upward import, a sideways import and a private name are each caught."""
    fake = tmp_path / "collector" / "lightning_otel" / "collector" / "bad.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(
        "from lightning_otel.trainer.update import build_batch\n"
        "from lightning_otel.gateway import server\n"
        "from lightning_otel.core.otlp import _private\n"
        "from lightning_otel.core import schema\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for folder in ("trainer/lightning_otel/trainer", "gateway/lightning_otel/gateway", "core/lightning_otel/core"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "trainer/lightning_otel/trainer/update.py").write_text("")
    (tmp_path / "gateway/lightning_otel/gateway/server.py").write_text("")
    (tmp_path / "core/lightning_otel/core/otlp.py").write_text("")
    (tmp_path / "core/lightning_otel/core/schema.py").write_text("")
    problems = violations("collector", 1, fake, "lightning_otel.collector.bad")
    assert len(problems) == 4, problems  # trainer (above), gateway (same layer, target + module), private name
    assert not any("core.schema" in p for p in problems)
