"""The public surface: what ``__all__`` promises exists and is documented."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest

import onceonly
import onceonly.dashboard
import onceonly.idempotency
import onceonly.providers

MODULES = [onceonly, onceonly.providers, onceonly.idempotency, onceonly.dashboard]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_exported_name_exists_and_is_documented(module: ModuleType) -> None:
    names = module.__all__
    assert len(set(names)) == len(names)
    for name in names:
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), f"{module.__name__}.{name} has no docstring"


def test_every_error_derives_from_the_one_root() -> None:
    errors = [
        getattr(onceonly, n)
        for n in onceonly.__all__
        if inspect.isclass(getattr(onceonly, n)) and issubclass(getattr(onceonly, n), Exception)
    ]
    assert len(errors) >= 10
    assert all(issubclass(e, onceonly.OnceonlyError) for e in errors)
