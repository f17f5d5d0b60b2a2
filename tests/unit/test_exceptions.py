"""One exceptions module, one root."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import onceonly
import onceonly.idempotency
from onceonly import _exceptions

SRC = Path(onceonly.__file__).parent


def _public_exceptions() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in (onceonly, onceonly.idempotency, _exceptions):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) and issubclass(value, BaseException):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return list(found.values())


@pytest.mark.parametrize("cls", _public_exceptions(), ids=lambda c: c.__name__)
def test_every_public_exception_derives_from_onceonly_error(cls: type) -> None:
    assert issubclass(cls, onceonly.OnceonlyError)
    assert cls.__module__ == "onceonly._exceptions"


def test_every_exception_class_of_onceonly_is_defined_in_the_one_module() -> None:
    stray = []
    for path in SRC.rglob("*.py"):
        if path.name == "_exceptions.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                if bases & {"Exception", "ValueError", "OnceonlyError", *_exceptions.__all__}:
                    stray.append(f"{path.relative_to(SRC)}:{node.name}")
    assert stray == []


def test_the_exceptions_module_is_a_leaf() -> None:
    tree = ast.parse(Path(_exceptions.__file__).read_text())
    imported = [
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    ] + [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
    assert [m for m in imported if m != "__future__"] == []


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("onceonly.guard", "JobConflict"),
        ("onceonly.guard", "JobInProgress"),
        ("onceonly.context", "EffectError"),
        ("onceonly.worker", "LeaseLost"),
        ("onceonly.idempotency.keys", "InvalidKey"),
        ("onceonly.importer.errors", "ImportSetupError"),
        ("onceonly.importer.errors", "FileFormatError"),
        ("onceonly.importer.errors", "InvalidValue"),
    ],
)
def test_old_import_paths_still_work(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is getattr(_exceptions, name)


def test_an_invalid_key_is_still_a_value_error() -> None:
    with pytest.raises(ValueError, match="key"):
        onceonly.idempotency.parse_key("")
    assert issubclass(onceonly.idempotency.InvalidKey, onceonly.OnceonlyError)
