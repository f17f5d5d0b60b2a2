"""Moved to :mod:`onceonly.store.engine`; this name stays for existing imports."""

from .store.engine import create_engine, engine_kind, write_lock_of

__all__ = ["create_engine", "engine_kind", "write_lock_of"]
