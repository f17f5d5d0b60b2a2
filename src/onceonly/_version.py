"""The package version, in a leaf module: the dashboard and the CLI read it
without importing ``onceonly/__init__.py`` (and, through it, the application).
Kept equal to ``pyproject.toml``'s version by tests/unit/test_public_api.py."""

__version__ = "0.1.0"
