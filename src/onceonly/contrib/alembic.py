"""Alembic's autogenerate, with onceonly's tables in the same database.

onceonly's tables (``onceonly_*``) are made and versioned by onceonly's own
migrations (``onceonly migrate``). A project whose Alembic environment points
at the same database would otherwise see them as tables its models lack, and
``alembic revision --autogenerate`` would propose dropping them. In ``env.py``::

    from onceonly.contrib.alembic import include_name

    context.configure(..., target_metadata=Base.metadata, include_name=include_name)

With a filter of the project's own, :func:`include_name_and` (or
:func:`include_object_and`) applies onceonly's rule first, then the project's.

A project that wants autogenerate to see onceonly's tables (its models refer
to them, or it checks that the schema is current) lists
:func:`metadata_for`'s description in its ``target_metadata`` instead; against
a database at onceonly's latest migration that proposes nothing for them.

Nothing here imports Alembic: the filters are plain functions of the shape
``context.configure`` takes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec

from ..store.schema import TABLE_PREFIX, describe
from ..store.url import DatabaseURL

if TYPE_CHECKING:
    import sqlalchemy as sa
    from alembic.runtime.environment import NameFilterParentNames, NameFilterType

    IncludeName = Callable[[str | None, NameFilterType, NameFilterParentNames], bool]
    IncludeObject = Callable[
        [sa.schema.SchemaItem, str | None, NameFilterType, bool, sa.schema.SchemaItem | None],
        bool,
    ]

__all__ = [
    "TABLE_PREFIX",
    "include_name",
    "include_name_and",
    "include_object",
    "include_object_and",
    "metadata_for",
]

_P = ParamSpec("_P")


def metadata_for(engine: str) -> sa.MetaData:
    """A new ``MetaData`` describing every onceonly table at onceonly's latest
    migration, on `engine`: ``"sqlite"`` or ``"postgresql"`` (a connection's
    ``dialect.name``), or a database URL.

    For ``target_metadata = [Base.metadata, metadata_for(...)]``. It holds
    what autogenerate compares by default (tables, columns, types,
    nullability, keys, indexes); it is not meant to create the tables: that is
    ``onceonly migrate``'s job, which also makes the trigger and version rows
    this cannot describe. Keep ``compare_server_default`` off for them.
    """
    kind = DatabaseURL.parse(engine).kind if "://" in engine else engine
    return describe(kind)


def _is_ours(table: str | None) -> bool:
    return table is not None and table.startswith(TABLE_PREFIX)


def include_name(
    name: str | None, type_: NameFilterType, parent_names: NameFilterParentNames
) -> bool:
    """Alembic's ``include_name`` hook: everything but onceonly's tables.

    A table named ``onceonly_*`` is left out, so neither it nor its columns,
    indexes, constraints or the sequences behind its ids are reflected or
    compared. Schemas and every other table pass.
    """
    if type_ == "table":
        return not _is_ours(name)
    if type_ == "schema":
        return True
    return not _is_ours(parent_names.get("table_name"))


def include_object(
    object_: sa.schema.SchemaItem,
    name: str | None,
    type_: NameFilterType,
    reflected: bool,
    compare_to: sa.schema.SchemaItem | None,
) -> bool:
    """Alembic's ``include_object`` hook: everything but onceonly's tables and
    what belongs to them.

    :func:`include_name` is the lighter choice (onceonly's tables are then not
    even reflected); this one is for an environment that filters objects.
    """
    if type_ == "table":
        return not _is_ours(name)
    table: Any = getattr(object_, "table", None)
    return not _is_ours(getattr(table, "name", None))


def include_name_and(user_filter: IncludeName) -> IncludeName:
    """An ``include_name`` hook that leaves out onceonly's tables, then asks
    `user_filter` (a hook of the same shape) about the rest."""
    return _both(include_name, user_filter)


def include_object_and(user_filter: IncludeObject) -> IncludeObject:
    """An ``include_object`` hook that leaves out onceonly's tables, then asks
    `user_filter` (a hook of the same shape) about the rest."""
    return _both(include_object, user_filter)


def _both(first: Callable[_P, bool], then: Callable[_P, bool]) -> Callable[_P, bool]:
    def combined(*args: _P.args, **kwargs: _P.kwargs) -> bool:
        return first(*args, **kwargs) and then(*args, **kwargs)

    return combined
