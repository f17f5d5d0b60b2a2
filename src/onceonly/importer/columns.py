"""The plan that maps a file's headers to the target table's columns (as
:mod:`onceonly.store.tables` describes them), each with the function that
turns a cell into that column's value.

Everything here is decided once, before the first row: a header that maps
nowhere useful, a key without a unique constraint, or a NOT NULL column the
file cannot fill stops the import before it writes anything.
"""

from __future__ import annotations

import re
import unicodedata
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

from ..store.tables import MissingTable, TargetColumn, TargetTable, ValueKind
from .errors import ImportSetupError, InvalidValue
from .keys import KeyType, normalizer
from .values import (
    DecimalMode,
    parse_bool,
    parse_date,
    parse_datetime,
    parse_decimal,
    parse_integer,
    parse_time,
    to_text,
)

__all__ = ["ColumnPlan", "Plan", "TargetColumn", "TargetTable", "plan_import", "target_table"]

Coerce = Callable[[object], object]


def target_table(found: TargetTable | MissingTable) -> TargetTable:
    """The table the store found, or the import stops naming the tables there are."""
    if isinstance(found, MissingTable):
        known = found.known
        hint = f"; tables: {', '.join(known[:30])}" if known else "; the database has no tables"
        raise ImportSetupError(f"no table {found.name!r} in the database{hint}")
    return found


# -- mapping headers to columns -------------------------------------------------


def _folded(name: str) -> str:
    """A header or column name with case, accents and punctuation ignored:
    ``Data de Nascimento``, ``data_de_nascimento`` and ``DATA-DE-NASCIMENTO`` match."""
    decomposed = unicodedata.normalize("NFKD", name)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    return re.sub(r"[\W_]+", "", plain.casefold())


@dataclass(frozen=True)
class ColumnPlan:
    """One file column that is written: where it is in a row, where it goes,
    and how a cell becomes that column's value."""

    index: int
    header: str
    column: str
    coerce: Coerce
    key_type: KeyType | None = None


@dataclass(frozen=True)
class Plan:
    """What goes where. `columns` are in file order; `key` are column names
    (in the order given); `key_positions` index into `columns`."""

    table: TargetTable
    columns: list[ColumnPlan]
    key: list[str]
    key_positions: list[int]
    ignored_headers: list[str] = field(default_factory=list)
    width: int = 0

    @property
    def column_names(self) -> list[str]:
        return [c.column for c in self.columns]

    @property
    def mapping(self) -> dict[str, str]:
        return {c.header: c.column for c in self.columns}


def _resolve_headers(
    headers: Sequence[str], table: TargetTable, mapping: Mapping[str, str | None]
) -> tuple[dict[int, str], list[str]]:
    """File position -> column name, and the headers left out."""
    by_fold: dict[str, list[str]] = {}
    for name in table.columns:
        by_fold.setdefault(_folded(name), []).append(name)
    explicit: dict[int, str | None] = {}
    for wanted, target in mapping.items():
        positions = [i for i, h in enumerate(headers) if h == wanted] or [
            i for i, h in enumerate(headers) if _folded(h) == _folded(wanted)
        ]
        if not positions:
            raise ImportSetupError(
                f"--map {wanted}=...: the file has no header {wanted!r}; "
                f"its headers are: {', '.join(repr(h) for h in headers)}"
            )
        if target and target not in table.columns:
            raise ImportSetupError(
                f"--map {wanted}={target}: table {table.display_name} has no column "
                f"{target!r}; its columns are: {', '.join(table.columns)}"
            )
        for i in positions:
            explicit[i] = target or None
    chosen: dict[int, str] = {}
    ignored: list[str] = []
    for i, header in enumerate(headers):
        if i in explicit:
            target = explicit[i]
        elif header in table.columns:
            target = header
        else:
            candidates = by_fold.get(_folded(header), []) if header else []
            target = candidates[0] if len(candidates) == 1 else None
        if target is None:
            if header:
                ignored.append(header)
            continue
        chosen[i] = target
    seen: dict[str, int] = {}
    for i, column in chosen.items():
        if column in seen:
            raise ImportSetupError(
                f"headers {headers[seen[column]]!r} and {headers[i]!r} both map to column "
                f"{column!r}; pick one with --map (e.g. --map '{headers[i]}=' leaves it out)"
            )
        seen[column] = i
    return chosen, ignored


def _key_types(
    key: Sequence[str], key_types: Mapping[str, KeyType | str] | None
) -> dict[str, KeyType]:
    result = dict.fromkeys(key, KeyType.RAW)
    for column, kind in (key_types or {}).items():
        if column not in result:
            raise ImportSetupError(
                f"key type given for {column!r}, which is not a key column ({', '.join(key)})"
            )
        try:
            result[column] = KeyType(kind)
        except ValueError:
            choices = ", ".join(k.value for k in KeyType)
            raise ImportSetupError(f"unknown key type {kind!r}; use one of {choices}") from None
    return result


def plan_import(
    headers: Sequence[str],
    table: TargetTable,
    *,
    key: Sequence[str],
    key_types: Mapping[str, KeyType | str] | None = None,
    mapping: Mapping[str, str | None] | None = None,
    decimal: DecimalMode = "auto",
) -> Plan:
    """Map `headers` onto `table` and check that the import can work at all."""
    if not key:
        raise ImportSetupError("give the key column(s), e.g. --key cpf")
    for column in key:
        if column not in table.columns:
            raise ImportSetupError(
                f"table {table.display_name} has no column {column!r} for the key; "
                f"its columns are: {', '.join(table.columns)}"
            )
    if len(set(key)) != len(key):
        raise ImportSetupError(f"the key names a column twice: {', '.join(key)}")
    if not any(set(key) == set(unique) for unique in table.unique_keys):
        raise ImportSetupError(_not_unique_message(table, key))
    kinds = _key_types(key, key_types)
    chosen, ignored = _resolve_headers(headers, table, mapping or {})
    mapped = set(chosen.values())
    for column in key:
        if column not in mapped:
            raise ImportSetupError(
                f"the file has no column for key {column!r} (headers: "
                f"{', '.join(repr(h) for h in headers)}); map one with --map HEADER={column}"
            )
    for target in table.columns.values():
        if target.name in mapped and target.generated_always:
            raise ImportSetupError(
                f"column {target.name!r} is generated by the database and cannot be written; "
                f"leave header {headers[_position(chosen, target.name)]!r} out with "
                f"--map '{headers[_position(chosen, target.name)]}='"
            )
        if target.name not in mapped and not target.nullable and not target.has_default:
            raise ImportSetupError(
                f"column {target.name!r} is NOT NULL and has no default, and the file has no "
                f"column for it; map one with --map HEADER={target.name}"
            )
    columns = []
    for i, column in sorted(chosen.items()):
        target = table.columns[column]
        kind = kinds.get(column)
        columns.append(
            ColumnPlan(
                index=i,
                header=headers[i],
                column=column,
                coerce=_coercer(target, decimal, kind),
                key_type=kind,
            )
        )
    names = [c.column for c in columns]
    return Plan(
        table=table,
        columns=columns,
        key=list(key),
        key_positions=[names.index(k) for k in key],
        ignored_headers=ignored,
        width=len(headers),
    )


def _position(chosen: Mapping[int, str], column: str) -> int:
    return next(i for i, c in chosen.items() if c == column)


def _not_unique_message(table: TargetTable, key: Sequence[str]) -> str:
    wanted = ", ".join(key)
    if table.unique_keys:
        have = "; ".join("(" + ", ".join(k) + ")" for k in table.unique_keys)
        found = f"its unique keys are: {have}"
    else:
        found = "it has no primary key and no unique constraint"
    return (
        f"the key ({wanted}) is not backed by a unique constraint on {table.display_name}, "
        f"so the database cannot tell a new row from an existing one; {found}. "
        f"Add one, e.g. CREATE UNIQUE INDEX ON {table.display_name} ({wanted}), "
        "or use one of those keys"
    )


# -- cell -> column value ------------------------------------------------------------


def _coercer(column: TargetColumn, decimal: DecimalMode, key_type: KeyType | None) -> Coerce:
    parse = _parser(column, decimal)
    normalize = normalizer(key_type) if key_type and key_type is not KeyType.RAW else None
    name = column.name

    def empty() -> None:
        if key_type is not None:
            raise InvalidValue(f"missing key: {name} is empty")
        if not column.nullable:
            raise InvalidValue(f"{name} is empty, and the column is NOT NULL")

    # Called for every cell of every row: the common case (non-empty text)
    # takes one class check and one call.
    if normalize is not None:

        def coerce_key(value: object) -> object:
            if value is None or (value.__class__ is str and (not value or value.isspace())):
                empty()
            return parse(normalize(value))

        return coerce_key

    if parse is to_text:

        def coerce_text(value: object) -> object:
            if value.__class__ is str:
                if value and not value.isspace():
                    return value
            elif value is not None:
                return to_text(value)
            empty()
            return None

        return coerce_text

    def coerce(value: object) -> object:
        if value.__class__ is str:
            if value and not value.isspace():
                return parse(value)
        elif value is not None:
            return parse(value)
        empty()
        return None

    return coerce


def _parser(column: TargetColumn, decimal: DecimalMode) -> Coerce:
    parse = _parse(column, decimal)
    bind = column.bind
    if bind is None:
        return parse
    # What the driver is given instead of the parsed value (on SQLite: booleans
    # as SQLAlchemy binds them, decimals as their text): the store says how.
    return lambda value: bind(parse(value))


def _parse(column: TargetColumn, decimal: DecimalMode) -> Coerce:
    kind = column.kind
    if kind is ValueKind.BOOLEAN:
        return parse_bool
    if kind is ValueKind.INTEGER:
        bits = column.integer_bits
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

        def integer(value: object) -> int:
            number = parse_integer(value, decimal)
            if not low <= number <= high:
                raise InvalidValue(
                    f"{number} is out of range for {column.name} ({column.type_name})"
                )
            return number

        return integer
    if kind is ValueKind.FLOAT:
        return lambda value: float(parse_decimal(value, decimal))
    if kind is ValueKind.NUMERIC:
        return _numeric(column, decimal)
    if kind is ValueKind.DATETIME:
        return parse_datetime
    if kind is ValueKind.DATE:
        return parse_date
    if kind is ValueKind.TIME:
        return parse_time
    if kind is ValueKind.UUID:

        def to_uuid(value: object) -> uuid.UUID:
            try:
                return uuid.UUID(to_text(value).strip())
            except ValueError:
                raise InvalidValue(f"{value!r} is not a UUID") from None

        return to_uuid
    if column.length:
        length = column.length

        def bounded(value: object) -> str:
            text = to_text(value)
            if len(text) > length:
                raise InvalidValue(
                    f"{column.name} has {len(text)} characters, the column holds {length}"
                )
            return text

        return bounded
    # Text, and types we do not know (JSON, arrays, enums...): the database
    # checks them, and a value it refuses rejects only its own row.
    return to_text


def _numeric(column: TargetColumn, decimal: DecimalMode) -> Coerce:
    precision, scale = column.precision, column.scale
    exponent = Decimal(1).scaleb(-scale) if scale is not None else None
    limit = Decimal(10) ** (precision - (scale or 0)) if precision else None

    def numeric(value: object) -> Decimal:
        number = parse_decimal(value, decimal)
        if exponent is not None:
            # PostgreSQL rounds half away from zero to the column's scale; do it
            # here so the comparison on a re-run sees the stored value.
            number = number.quantize(exponent, rounding=ROUND_HALF_UP)
        if limit is not None and abs(number) >= limit:
            raise InvalidValue(
                f"{value!r} is too large for {column.name} (numeric({precision},{scale or 0}))"
            )
        return number

    return numeric
