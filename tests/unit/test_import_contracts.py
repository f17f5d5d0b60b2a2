"""The import direction in `.importlinter` holds (also run as `lint-imports` in CI).

A module that reaches past its layer (the store importing the worker, a
provider opening a database, a driver imported outside the store) makes this
fail with import-linter's report of the offending chain of imports.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_are_kept(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    # import-linter configures logging with logging.config, which disables
    # every logger that exists already: later tests' caplog would hear nothing.
    loggers = [
        logger
        for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger) and not logger.disabled
    ]
    try:
        status = lint_imports(config_filename=str(ROOT / ".importlinter"), no_cache=True)
    finally:
        for logger in loggers:
            logger.disabled = False
    report = capsys.readouterr().out
    assert status == 0, report
    assert "0 broken" in report
