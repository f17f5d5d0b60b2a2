"""A user's own table as the database describes it: the target of an import.

The importer plans from this description alone (which columns, which unique
keys, what each column holds); what SQLAlchemy's inspector and the dialect say
about types is turned here into :class:`ValueKind` and a few numbers, so no
SQLAlchemy type or dialect leaves ``store/``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import sqlalchemy as sa

__all__ = ["MissingTable", "TargetColumn", "TargetTable", "ValueKind", "reflect_table"]


class ValueKind(Enum):
    """What a column holds, as far as turning a cell into its value goes."""

    BOOLEAN = "boolean"
    INTEGER = "integer"
    FLOAT = "float"
    NUMERIC = "numeric"
    DATETIME = "datetime"
    DATE = "date"
    TIME = "time"
    UUID = "uuid"
    # Text, and types the importer does not convert (JSON, arrays, enums...):
    # the database checks those, and a value it refuses rejects only its row.
    TEXT = "text"


@dataclass(frozen=True)
class TargetColumn:
    """One column of the target table, as reflected.

    `type_name` is the column's type as SQL spells it (``SMALLINT``), for
    messages; `integer_bits` the range of an INTEGER column (64 on SQLite,
    whatever it is declared); `precision`/`scale` a NUMERIC's; `length` a
    bounded text's. `bind`, when set, turns the parsed value into what the
    driver is given (SQLite only): the reflected type's own SQLAlchemy bind
    processor (of the reflected generic types, only BOOLEAN has one), and
    ``str`` for decimals (sqlite3 takes no Decimal; the text keeps every digit).
    `compare_as_text`: the column has no equality operator (PostgreSQL's
    ``json``), compare its text.
    """

    name: str
    kind: ValueKind
    nullable: bool
    has_default: bool
    generated_always: bool = False
    type_name: str = ""
    integer_bits: int = 64
    precision: int | None = None
    scale: int | None = None
    length: int | None = None
    bind: Callable[[Any], Any] | None = None
    compare_as_text: bool = False


@dataclass(frozen=True)
class TargetTable:
    """The target table: its columns in order, and every set of columns a
    unique constraint or unique index (not partial, no expressions) covers."""

    name: str
    schema: str | None
    columns: dict[str, TargetColumn]
    unique_keys: list[tuple[str, ...]]

    @property
    def display_name(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name


@dataclass(frozen=True)
class MissingTable:
    """No table of that name; `known` lists the tables the schema does have."""

    name: str
    known: tuple[str, ...]


_INTEGER_BITS = {"smallint": 16, "integer": 32, "bigint": 64}


def reflect_table(connection: sa.Connection, table: str) -> TargetTable | MissingTable:
    """Describe `table` (``name`` or ``schema.name``) through SQLAlchemy's inspector."""
    inspector = sa.inspect(connection)
    schema: str | None = None
    name = table
    if not inspector.has_table(name) and "." in table:
        schema, name = table.split(".", 1)
    if not inspector.has_table(name, schema=schema):
        return MissingTable(table, tuple(sorted(inspector.get_table_names(schema=schema))))
    sqlite = connection.dialect.name == "sqlite"
    with warnings.catch_warnings():
        # Expression indexes cannot back a key anyway; SQLAlchemy warns it skips them.
        warnings.simplefilter("ignore", sa.exc.SAWarning)
        raw_columns = inspector.get_columns(name, schema=schema)
        primary = inspector.get_pk_constraint(name, schema=schema)["constrained_columns"]
        if sqlite:
            uniques = _sqlite_unique_keys(connection, name, schema)
        else:
            uniques = [
                tuple(u["column_names"])
                for u in inspector.get_unique_constraints(name, schema=schema)
            ]
            for index in inspector.get_indexes(name, schema=schema):
                options = index.get("dialect_options", {})
                names = index["column_names"]
                if index["unique"] and "postgresql_where" not in options and None not in names:
                    uniques.append(tuple(str(n) for n in names))
    # SQLite's INTEGER PRIMARY KEY is the rowid: it fills itself in.
    rowid = sqlite and len(primary) == 1
    columns: dict[str, TargetColumn] = {}
    for c in raw_columns:
        is_rowid = rowid and c["name"] == primary[0] and isinstance(c["type"], sa.Integer)
        identity: dict[str, Any] = dict(c.get("identity") or {})
        columns[c["name"]] = _column(
            c["name"],
            c["type"],
            connection.dialect,
            nullable=bool(c["nullable"]) and c["name"] not in primary,
            has_default=c.get("default") is not None
            or bool(identity)
            or is_rowid
            or (c.get("autoincrement") is True),
            generated_always=bool(identity.get("always")) or bool(c.get("computed")),
        )
    keys = ([tuple(primary)] if primary else []) + uniques
    distinct = list(dict.fromkeys(keys))
    return TargetTable(name=name, schema=schema, columns=columns, unique_keys=distinct)


def _column(
    name: str,
    kind: Any,
    dialect: sa.Dialect,
    *,
    nullable: bool,
    has_default: bool,
    generated_always: bool,
) -> TargetColumn:
    """The column described in the importer's terms; the order of the checks
    matters (Float is a Numeric, Uuid must not fall to text before its turn)."""
    sqlite = dialect.name == "sqlite"
    common: dict[str, Any] = {
        "name": name,
        "nullable": nullable,
        "has_default": has_default,
        "generated_always": generated_always,
    }

    def with_bind(value_kind: ValueKind) -> TargetColumn:
        # The reflected type's processor on SQLite, as the importer always used it.
        bind = kind.bind_processor(dialect) if sqlite else None
        return TargetColumn(kind=value_kind, bind=bind, **common)

    if isinstance(kind, sa.Boolean):
        return with_bind(ValueKind.BOOLEAN)
    if isinstance(kind, sa.Integer):
        return TargetColumn(
            kind=ValueKind.INTEGER,
            type_name=_type_name(kind),
            integer_bits=64 if sqlite else _integer_bits(kind),
            **common,
        )
    if isinstance(kind, sa.Float):
        return TargetColumn(kind=ValueKind.FLOAT, **common)
    if isinstance(kind, sa.Numeric):
        # SQLite has no decimal type: the exact value goes in as its text.
        return TargetColumn(
            kind=ValueKind.NUMERIC,
            precision=kind.precision,
            scale=kind.scale,
            bind=str if sqlite else None,
            **common,
        )
    if isinstance(kind, sa.DateTime):
        return with_bind(ValueKind.DATETIME)
    if isinstance(kind, sa.Date):
        return with_bind(ValueKind.DATE)
    if isinstance(kind, sa.Time):
        return with_bind(ValueKind.TIME)
    if isinstance(kind, sa.Uuid) and not sqlite:
        return TargetColumn(kind=ValueKind.UUID, **common)
    if isinstance(kind, sa.String) and kind.length:
        return TargetColumn(kind=ValueKind.TEXT, length=kind.length, **common)
    # json (unlike jsonb) has no equality operator: the upsert compares its text.
    as_text = isinstance(kind, sa.JSON) and type(kind).__name__ != "JSONB"
    return TargetColumn(kind=ValueKind.TEXT, compare_as_text=as_text and not sqlite, **common)


def _type_name(kind: Any) -> str:
    try:
        return str(kind)
    except sa.exc.SQLAlchemyError:  # a type the default dialect cannot spell
        return type(kind).__name__.upper()


def _integer_bits(kind: Any) -> int:
    name = type(kind).__name__.lower()
    if isinstance(kind, sa.SmallInteger) or name == "smallint":
        return 16
    if isinstance(kind, sa.BigInteger) or name == "bigint":
        return 64
    return _INTEGER_BITS.get(name, 32)


def _sqlite_unique_keys(
    connection: sa.Connection, table: str, schema: str | None
) -> list[tuple[str, ...]]:
    # PRAGMA sees every unique index, including the automatic ones behind
    # inline UNIQUE and PRIMARY KEY clauses that the inspector leaves out.
    prefix = f'"{schema}".' if schema else ""
    keys: list[tuple[str, ...]] = []
    indexes = connection.exec_driver_sql(f'PRAGMA {prefix}index_list("{table}")').all()
    for index in indexes:
        if not index.unique or index.partial:
            continue
        info = connection.exec_driver_sql(f'PRAGMA {prefix}index_info("{index.name}")').all()
        names = [row.name for row in info]
        if names and None not in names:
            keys.append(tuple(names))
    return keys
