"""The importer against a real SQLite file and a real PostgreSQL: what a user
sees in their own table after importing, and importing again."""

from __future__ import annotations

import csv
import threading
from collections.abc import Iterator, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

import openpyxl  # type: ignore[import-untyped]
import pytest
import sqlalchemy as sa

from onceonly.db import create_engine
from onceonly.importer import ImportReport, ImportSetupError, import_file

metadata = sa.MetaData()
clientes = sa.Table(
    "clientes",
    metadata,
    sa.Column("cpf", sa.String(11), primary_key=True),
    sa.Column("nome", sa.String(40), nullable=False),
    sa.Column("cidade", sa.Text),
    sa.Column("nascimento", sa.Date),
    sa.Column(
        "credito",
        sa.Numeric(12, 2, asdecimal=False),
        sa.CheckConstraint("credito >= 0", name="credito_not_negative"),
    ),
    sa.Column("ativo", sa.Boolean),
    sa.Column("email", sa.String(80), unique=True),
    sa.Column("observacao", sa.Text),  # in no file: an import must leave it alone
)
HEADER = ["CPF", "Nome", "Cidade", "Nascimento", "Crédito", "Ativo", "E-mail"]
ROWS = [
    ["123.456.789-09", "João da Silva", "São Paulo", "31/12/1980", "1.234,56", "sim", "joao@x.br"],
    ["52998224725", "Maria Conceição", "Recife", "1975-01-02", "10,5", "não", "maria@x.br"],
    ["390.533.447-05", "Pedro Araújo", "Goiânia", "02/03/1990", "0", "s", ""],
    ["111.444.777-35", "Ana Gonçalves", "", "", "", "", "ana@x.br"],
]


@pytest.fixture
def db(database_url: str) -> Iterator[sa.Engine]:
    """An engine on the test database, with the clientes table created."""
    engine = create_engine(database_url, pool_size=2)
    metadata.create_all(engine)
    yield engine
    engine.dispose()


def write_csv(path: Path, rows: Sequence[Sequence[str]], header: Sequence[str] = HEADER) -> Path:
    """As Excel writes a CSV in Brazil: ';', Windows-1252, CRLF."""
    with path.open("w", encoding="cp1252", newline="") as f:
        out = csv.writer(f, delimiter=";", lineterminator="\r\n")
        out.writerow(header)
        out.writerows(rows)
    return path


def table(engine: sa.Engine, t: sa.Table = clientes) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(t).order_by(*t.primary_key))]


def run(path: Path, database_url: str, **options: Any) -> ImportReport:
    options.setdefault("key_types", {"cpf": "cpf"})
    return import_file(path, database_url=database_url, table="clientes", key="cpf", **options)


def add_update_audit(engine: sa.Engine) -> None:
    """Every UPDATE of a clientes row leaves a line in update_audit."""
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE update_audit (cpf TEXT)")
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql(
                "CREATE TRIGGER clientes_audit AFTER UPDATE ON clientes "
                "BEGIN INSERT INTO update_audit VALUES (new.cpf); END"
            )
        else:
            conn.exec_driver_sql(
                "CREATE FUNCTION audit_update() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN INSERT INTO update_audit VALUES (NEW.cpf); RETURN NEW; END $$"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER clientes_audit AFTER UPDATE ON clientes "
                "FOR EACH ROW EXECUTE FUNCTION audit_update()"
            )


def audited(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(r[0] for r in conn.exec_driver_sql("SELECT cpf FROM update_audit"))


def test_importing_the_same_file_twice_changes_nothing_the_second_time(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    add_update_audit(db)
    path = write_csv(tmp_path / "clientes.csv", ROWS)

    first = run(path, database_url)
    assert (first.inserted, first.updated, first.unchanged, first.rejected) == (4, 0, 0, 0)
    after_first = table(db)
    assert after_first == [
        ("11144477735", "Ana Gonçalves", None, None, None, None, "ana@x.br", None),
        (
            "12345678909",
            "João da Silva",
            "São Paulo",
            date(1980, 12, 31),
            1234.56,
            True,
            "joao@x.br",
            None,
        ),
        ("39053344705", "Pedro Araújo", "Goiânia", date(1990, 3, 2), 0.0, True, None, None),
        (
            "52998224725",
            "Maria Conceição",
            "Recife",
            date(1975, 1, 2),
            10.5,
            False,
            "maria@x.br",
            None,
        ),
    ]

    second = run(path, database_url)
    assert (second.inserted, second.updated, second.unchanged, second.rejected) == (0, 0, 4, 0)
    assert table(db) == after_first
    # Untouched means untouched: no UPDATE reached the table, so no trigger
    # fired and nothing an updated_at trigger would bump.
    assert audited(db) == []
    if db.dialect.name == "postgresql":
        # Not even locked: a row lock leaves the locker's transaction id in
        # xmax (and a WAL record per row, replicated for nothing).
        with db.connect() as conn:
            sql = "SELECT count(*) FROM clientes WHERE xmax::text <> '0'"
            assert conn.exec_driver_sql(sql).scalar_one() == 0


def test_a_changed_row_is_updated_and_columns_not_in_the_file_are_kept(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    run(write_csv(tmp_path / "v1.csv", ROWS), database_url)
    with db.begin() as conn:
        conn.execute(clientes.update().values(observacao="cliente antigo"))
    add_update_audit(db)
    changed = [row[:] for row in ROWS]
    changed[1][2] = "Olinda"
    report = run(write_csv(tmp_path / "v2.csv", changed), database_url)
    assert (report.inserted, report.updated, report.unchanged) == (0, 1, 3)
    assert audited(db) == ["52998224725"]
    rows = {r[0]: r for r in table(db)}
    assert rows["52998224725"][2] == "Olinda"
    assert {r[7] for r in rows.values()} == {"cliente antigo"}


def test_one_customer_written_two_ways_is_one_row_and_an_invalid_cpf_is_rejected(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    rows = [
        ["123.456.789-09", "João", "Santos", "", "", "", ""],
        ["123.456.789-00", "Falso", "", "", "", "", ""],  # line 3: wrong check digits
        ["12345678909", "João da Silva", "Santos", "", "", "", ""],  # the same CPF
    ]
    report = run(write_csv(tmp_path / "c.csv", rows), database_url)
    assert table(db) == [("12345678909", "João da Silva", "Santos", None, None, None, None, None)]
    # Rows are applied in file order: the later spelling updates the earlier.
    assert (report.inserted, report.updated, report.rejected) == (1, 1, 1)
    [rejection] = report.rejections
    assert (rejection.line, rejection.column, rejection.value) == (3, "cpf", "123.456.789-00")
    assert "invalid CPF" in rejection.reason
    assert "check digits" in rejection.reason


def test_the_last_occurrence_of_a_key_wins_across_batch_boundaries(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    names = ["a", "b", "c", "d", "e", "f", "g"]
    cpfs = ["12345678909", "52998224725", "12345678909", "12345678909", "39053344705"]
    rows = [[cpf, name, "", "", "", "", ""] for cpf, name in zip(cpfs * 2, names, strict=False)]
    report = run(write_csv(tmp_path / "dups.csv", rows), database_url, batch_size=2)
    assert report.rows == 7
    assert report.inserted == 3
    assert {r[0]: r[1] for r in table(db)} == {
        "12345678909": "f",
        "52998224725": "g",
        "39053344705": "e",
    }


def test_values_are_converted_and_bad_ones_rejected_with_line_and_reason(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    rows = [
        ["12345678909", "Ok", "", "01/02/2003", "R$ 1.234,50", "Sim", ""],  # line 2
        ["52998224725", "Bad date", "", "31/02/2003", "", "", ""],  # 3
        ["39053344705", "Bad number", "", "", "1,2,3", "", ""],  # 4
        ["11144477735", "Bad flag", "", "", "", "talvez", ""],  # 5
        ["", "No key", "", "", "", "", ""],  # 6
        ["01234567890", "", "", "", "", "", ""],  # 7: nome is NOT NULL
        ["01234567890", "x" * 41, "", "", "", "", ""],  # 8: nome holds 40
        ["01234567890", "Ok too", "", "2003-02-01", "7", "0", ""],  # 9
    ]
    report = run(write_csv(tmp_path / "types.csv", rows), database_url)
    assert (report.inserted, report.rejected) == (2, 6)
    assert [(r.line, r.column) for r in report.rejections] == [
        (3, "nascimento"),
        (4, "credito"),
        (5, "ativo"),
        (6, "cpf"),
        (7, "nome"),
        (8, "nome"),
    ]
    reasons = [r.reason for r in report.rejections]
    assert "not a valid date" in reasons[0]
    assert "not a number" in reasons[1]
    assert "sim/não" in reasons[2]
    assert "missing key" in reasons[3]
    assert "NOT NULL" in reasons[4]
    assert "41 characters" in reasons[5]
    assert table(db) == [
        ("01234567890", "Ok too", None, date(2003, 2, 1), 7.0, False, None, None),
        ("12345678909", "Ok", None, date(2003, 2, 1), 1234.5, True, None, None),
    ]


def test_a_row_the_database_refuses_is_rejected_alone(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    rows = [
        ["12345678909", "A", "", "", "1", "", "a@x.br"],
        ["52998224725", "B", "", "", "-5", "", ""],  # line 3: CHECK credito >= 0
        ["39053344705", "C", "", "", "2", "", "a@x.br"],  # line 4: email is unique
        ["11144477735", "D", "", "", "3", "", ""],
    ]
    report = run(write_csv(tmp_path / "refused.csv", rows), database_url)
    assert (report.inserted, report.rejected) == (2, 2)
    assert [r.line for r in report.rejections] == [3, 4]
    assert "credito_not_negative" in report.rejections[0].reason.lower()
    assert "email" in report.rejections[1].reason.lower()
    assert [r[0] for r in table(db)] == ["11144477735", "12345678909"]


def test_a_key_without_a_unique_constraint_is_refused_naming_the_keys_there_are(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    path = write_csv(tmp_path / "c.csv", ROWS)
    with pytest.raises(ImportSetupError) as refused:
        import_file(path, database_url=database_url, table="clientes", key="nome")
    message = str(refused.value)
    assert "(nome) is not backed by a unique constraint" in message
    assert "(cpf)" in message
    assert "(email)" in message
    assert table(db) == []


def test_a_missing_table_is_named(db: sa.Engine, database_url: str, tmp_path: Path) -> None:
    with pytest.raises(ImportSetupError, match=r"no table 'customers'.*clientes"):
        import_file(
            write_csv(tmp_path / "c.csv", ROWS),
            database_url=database_url,
            table="customers",
            key="cpf",
        )


def test_a_dry_run_reports_what_would_happen_and_writes_nothing(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    path = write_csv(tmp_path / "c.csv", [*ROWS, ["123", "Bad", "", "", "", "", ""]])
    dry = run(path, database_url, dry_run=True)
    assert (dry.inserted, dry.rejected, dry.dry_run, dry.written) == (4, 1, True, False)
    assert table(db) == []
    real = run(path, database_url)
    assert (real.inserted, real.rejected, real.written) == (4, 1, True)


def test_max_errors_stops_at_the_line_and_keeps_the_rows_before(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    rows = [
        ["12345678909", "A", "", "", "", "", ""],
        ["1", "bad", "", "", "", "", ""],  # line 3
        ["52998224725", "B", "", "", "", "", ""],
        ["2", "bad", "", "", "", "", ""],  # line 5: the second error, one too many
        ["39053344705", "C", "", "", "", "", ""],
    ]
    path = write_csv(tmp_path / "c.csv", rows)
    report = run(path, database_url, max_errors=1)
    assert (report.completed, report.stopped_at_line) == (False, 5)
    assert (report.inserted, report.rejected, report.rows) == (2, 2, 4)
    assert [r[1] for r in table(db)] == ["A", "B"]

    first = run(path, database_url, max_errors=0)
    assert (first.stopped_at_line, first.rejected) == (3, 1)


def test_all_or_nothing_keeps_nothing_when_stopped(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    rows = [["12345678909", "A", "", "", "", "", ""], ["1", "bad", "", "", "", "", ""]]
    report = run(
        write_csv(tmp_path / "c.csv", rows), database_url, max_errors=0, all_or_nothing=True
    )
    assert (report.stopped_at_line, report.inserted, report.written) == (3, 1, False)
    assert table(db) == []


def test_a_database_refusal_can_also_stop_the_import(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    rows = [
        ["12345678909", "A", "", "", "1", "", ""],
        ["52998224725", "B", "", "", "-1", "", ""],  # line 3: refused by the CHECK
        ["39053344705", "C", "", "", "1", "", ""],
    ]
    report = run(write_csv(tmp_path / "c.csv", rows), database_url, max_errors=0)
    assert (report.stopped_at_line, report.inserted) == (3, 1)
    assert [r[1] for r in table(db)] == ["A"]


def test_rejected_rows_go_to_a_file_ready_to_fix_and_import_again(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    rows = [*ROWS, ["123.456.789-00", "Falso", "", "", "", "", ""]]
    rejects = tmp_path / "rejeitados.csv"
    run(write_csv(tmp_path / "c.csv", rows), database_url, rejects=rejects)
    with rejects.open(encoding="utf-8-sig", newline="") as f:
        kept = list(csv.reader(f, delimiter=";"))
    assert kept[0] == ["rejected_line", "rejected_reason", *HEADER]
    assert kept[1][0] == "6"
    assert "check digits" in kept[1][1]
    assert kept[1][2:] == rows[-1]


def test_rejected_cells_never_run_as_formulas_in_a_spreadsheet(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    hostile = ['=HYPERLINK("http://evil.example")', "@SUM(1+1)", "+1+1", "-2+3"]
    rows = [["123.456.789-00", *hostile, "-1.234,56", ""]]
    rejects = tmp_path / "rejeitados.csv"
    run(write_csv(tmp_path / "c.csv", rows), database_url, rejects=rejects)
    with rejects.open(encoding="utf-8-sig", newline="") as f:
        kept = list(csv.reader(f, delimiter=";"))
    cells = kept[1][3:]  # after the line, the reason and the CPF
    assert cells[:4] == ["'" + cell for cell in hostile]
    assert cells[4] == "-1.234,56"  # a plain negative number stays a number


def test_headers_are_mapped_by_name_or_explicitly(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    header = ["Documento", "NOME", "Observações", "Cidade"]
    path = write_csv(tmp_path / "c.csv", [["12345678909", "Ana", "x", "Rio"]], header)
    report = run(path, database_url, mapping={"Documento": "cpf", "Cidade": None})
    assert report.columns == {"Documento": "cpf", "NOME": "nome"}
    assert report.ignored_headers == ("Observações", "Cidade")
    assert table(db) == [("12345678909", "Ana", None, None, None, None, None, None)]

    with pytest.raises(ImportSetupError, match="no column 'documento'"):
        run(path, database_url, mapping={"Documento": "documento"})
    with pytest.raises(ImportSetupError, match="no column for key 'cpf'"):
        run(path, database_url)


def test_xlsx_with_number_and_date_cells(db: sa.Engine, database_url: str, tmp_path: Path) -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Clientes"
    sheet.append(HEADER)
    sheet.append([12345678909, "João", "Rio", datetime(1980, 12, 31), 1234.5, True, None])
    sheet.append([1234567890, "Zero à esquerda", None, None, 3, False, None])  # 01234567890
    path = tmp_path / "clientes.xlsx"
    book.save(path)
    first = run(path, database_url)
    assert (first.format, first.sheet, first.inserted) == ("xlsx", "Clientes", 2)
    assert table(db) == [
        ("01234567890", "Zero à esquerda", None, None, 3.0, False, None, None),
        ("12345678909", "João", "Rio", date(1980, 12, 31), 1234.5, True, None, None),
    ]
    assert run(path, database_url).unchanged == 2


def test_a_composite_key_of_cnpj_and_code(database_url: str, tmp_path: Path) -> None:
    engine = create_engine(database_url, pool_size=1)
    products = sa.Table(
        "produtos",
        sa.MetaData(),
        sa.Column("cnpj", sa.String(14), nullable=False),
        sa.Column("sku", sa.String(20), nullable=False),
        sa.Column("preco", sa.Numeric(10, 2, asdecimal=False)),
        sa.UniqueConstraint("cnpj", "sku"),
    )
    products.create(engine)
    rows = [
        ["11.222.333/0001-81", " ABC-1 ", "10,00"],
        ["11222333000181", "abc-1", "12,00"],  # the same product
        ["12.ABC.345/01DE-35", "ABC-1", "5"],
    ]
    path = write_csv(tmp_path / "p.csv", rows, ["CNPJ", "SKU", "Preço"])
    report = import_file(
        path,
        database_url=database_url,
        table="produtos",
        key="cnpj,sku",
        key_types={"cnpj": "cnpj", "sku": "code"},
    )
    assert (report.inserted, report.updated) == (2, 1)
    with engine.connect() as conn:
        stored = conn.execute(sa.select(products).order_by("cnpj")).all()
    assert [tuple(r) for r in stored] == [
        ("11222333000181", "abc-1", 12.0),
        ("12ABC34501DE35", "abc-1", 5.0),
    ]
    engine.dispose()


def test_two_imports_at_once_do_not_duplicate_customers(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    rows = [[f"{n:011d}", f"n{i}", "", "", "", "", ""] for i, n in enumerate(_cpfs(300))]
    path = write_csv(tmp_path / "c.csv", rows)
    reports: list[ImportReport] = []

    def one() -> None:
        reports.append(run(path, database_url, batch_size=50))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(table(db)) == 300
    assert sum(r.inserted for r in reports) == 300
    assert sum(r.unchanged for r in reports) == 300


def _cpfs(n: int) -> list[int]:
    """`n` valid CPFs, as numbers."""
    found = []
    for base in range(100_000_000, 100_000_000 + 7 * n, 7):
        d = [int(c) for c in f"{base:09d}"]
        for weights in (range(10, 1, -1), range(11, 1, -1)):
            r = sum(a * b for a, b in zip(d, weights, strict=False)) % 11
            d.append(0 if r < 2 else 11 - r)
        found.append(int("".join(map(str, d))))
    return found


def test_text_is_stored_exactly_as_in_the_file(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    odd = ["tab\there", "two\r\nlines", "back\\slash", "\\N", 'say "oi"', "  spaced  "]
    rows = [[f"{n:011d}", text, "", "", "", "", ""] for n, text in zip(_cpfs(6), odd, strict=True)]
    report = run(write_csv(tmp_path / "odd.csv", rows), database_url)
    assert report.inserted == 6
    assert sorted(r[1] for r in table(db)) == sorted(odd)
    assert run(write_csv(tmp_path / "odd.csv", rows), database_url).unchanged == 6


def test_rejections_and_rows_interleaved_across_small_batches(
    db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    good = iter(_cpfs(4))
    rows = [
        [f"{next(good):011d}", "ok", "", "", "", "", ""] if i % 3 == 0 else [str(i), "bad"]
        for i in range(12)
    ]
    report = run(write_csv(tmp_path / "mixed.csv", rows), database_url, batch_size=2)
    assert (report.inserted, report.rejected, report.completed) == (4, 8, True)
    assert [r.line for r in report.rejections] == [3, 4, 6, 7, 9, 10, 12, 13]
    assert len(table(db)) == 4
