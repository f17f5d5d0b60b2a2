"""``onceonly import``, the real command as a subprocess: what a person and a
script see, and a run killed with SIGKILL halfway then simply run again."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from onceonly.db import create_engine
from ports import free_port

ONCEONLY = [sys.executable, "-m", "onceonly.cli"]
HEADER = ["CPF", "Nome", "Cidade", "Nascimento", "Limite", "Ativo"]
KEY = ["--table", "clientes", "--key", "cpf", "--key-type", "cpf"]


def clientes_table(name: str, metadata: sa.MetaData) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("cpf", sa.String(11), primary_key=True),
        sa.Column("nome", sa.Text, nullable=False),
        sa.Column("cidade", sa.Text),
        sa.Column("nascimento", sa.Date),
        sa.Column("limite", sa.Numeric(12, 2, asdecimal=False)),
        sa.Column("ativo", sa.Boolean),
    )


metadata = sa.MetaData()
clientes = clientes_table("clientes", metadata)
clean = clientes_table("clientes_clean", metadata)


@pytest.fixture
def db(database_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(database_url, pool_size=2)
    metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def env(database_url: str) -> dict[str, str]:
    return {**os.environ, "ONCEONLY_DATABASE_URL": database_url, "COLUMNS": "200"}


def run(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ONCEONLY, "import", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def write_csv(path: Path, rows: Sequence[Sequence[str]]) -> Path:
    with path.open("w", encoding="cp1252", newline="") as f:
        out = csv.writer(f, delimiter=";", lineterminator="\r\n")
        out.writerow(HEADER)
        out.writerows(rows)
    return path


def cpf(base: int) -> str:
    digits = [int(c) for c in f"{base:09d}"]
    for weights in (range(10, 1, -1), range(11, 1, -1)):
        remainder = sum(d * w for d, w in zip(digits, weights, strict=False)) % 11
        digits.append(0 if remainder < 2 else 11 - remainder)
    return "".join(map(str, digits))


def rows_of(engine: sa.Engine, table: sa.Table = clientes) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(table).order_by(table.c.cpf))]


SMALL = [
    ["123.456.789-09", "João da Silva", "São Paulo", "31/12/1980", "1.234,56", "sim"],
    ["52998224725", "Maria Conceição", "Recife", "02/01/1975", "10,5", "não"],
    ["390.533.447-05", "Pedro Araújo", "Goiânia", "02/03/1990", "0", "s"],
]


def test_help_explains_with_an_example(tmp_path: Path) -> None:
    top = subprocess.run([*ONCEONLY, "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert "import" in top.stdout
    result = run("--help", env=dict(os.environ), cwd=tmp_path)
    assert result.returncode == 0
    for text in ("onceonly import clientes.csv --table customers", "--key-type", "--dry-run"):
        assert text in result.stdout
    assert "Exit status" in result.stdout


def test_import_twice_the_second_run_changes_nothing(
    db: sa.Engine, env: dict[str, str], tmp_path: Path
) -> None:
    path = write_csv(tmp_path / "clientes.csv", SMALL)
    first = run(str(path), *KEY, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "inserted" in first.stdout
    assert "│ 3 │" in first.stdout.replace("  ", "")
    assert "cp1252" in first.stdout
    table_after_first = rows_of(db)
    assert len(table_after_first) == 3

    second = run(str(path), *KEY, "--format", "json", env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    report = json.loads(second.stdout)
    assert (report["unchanged"], report["inserted"], report["updated"]) == (3, 0, 0)
    assert report["columns"] == {
        "CPF": "cpf",
        "Nome": "nome",
        "Cidade": "cidade",
        "Nascimento": "nascimento",
        "Limite": "limite",
        "Ativo": "ativo",
    }
    assert rows_of(db) == table_after_first


def test_rejected_rows_are_listed_with_their_lines_and_the_exit_status_says_so(
    db: sa.Engine, env: dict[str, str], tmp_path: Path
) -> None:
    path = write_csv(tmp_path / "c.csv", [*SMALL, ["123.456.789-00", "Falso", "", "", "", ""]])
    result = run(str(path), *KEY, env=env, cwd=tmp_path)
    assert result.returncode == 4
    assert "rejected rows" in result.stdout
    line = next(x for x in result.stdout.splitlines() if "invalid CPF" in x)
    assert "5" in line.split()[1]  # the line number, in its own column
    assert len(rows_of(db)) == 3

    stopped = run(str(path), *KEY, "--max-errors", "0", "--format", "json", env=env, cwd=tmp_path)
    assert stopped.returncode == 5
    assert json.loads(stopped.stdout)["stopped_at_line"] == 5


def test_a_key_without_a_unique_constraint_is_refused_clearly(
    db: sa.Engine, env: dict[str, str], tmp_path: Path
) -> None:
    path = write_csv(tmp_path / "c.csv", SMALL)
    result = run(str(path), "--table", "clientes", "--key", "nome", env=env, cwd=tmp_path)
    assert result.returncode == 2
    message = " ".join(result.stderr.split())
    assert "(nome) is not backed by a unique constraint" in message
    assert "unique keys are: (cpf)" in message
    assert rows_of(db) == []


def test_dry_run_shows_the_report_and_writes_nothing(
    db: sa.Engine, env: dict[str, str], tmp_path: Path
) -> None:
    path = write_csv(tmp_path / "c.csv", SMALL)
    result = run(
        str(path), *KEY, "--dry-run", "--format", "json", "--progress", env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # the progress bar stays on stderr
    assert (report["inserted"], report["dry_run"], report["written"]) == (3, True, False)
    assert rows_of(db) == []


def test_an_unreachable_database_is_said_plainly(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "c.csv", SMALL)
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    result = run(str(path), *KEY, "--database-url", url, env=dict(os.environ), cwd=tmp_path)
    assert result.returncode == 3
    assert "database not reachable" in result.stderr


def test_a_file_that_is_not_there(env: dict[str, str], tmp_path: Path) -> None:
    result = run("nada.csv", *KEY, env=env, cwd=tmp_path)
    assert result.returncode == 2
    assert "no such file: nada.csv" in result.stderr


# -- killed halfway --------------------------------------------------------------

BIG_ROWS = 100_000
CITIES = ["São Paulo", "Recife", "Goiânia", "Maceió", "Florianópolis"]


@pytest.fixture(scope="module")
def big_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = []
    for i in range(BIG_ROWS):
        number = cpf(100_000_000 + 7 * i)
        shown = f"{number[:3]}.{number[3:6]}.{number[6:9]}-{number[9:]}" if i % 2 else number
        rows.append(
            [
                shown,
                f"Cliente {i} Conceição",
                CITIES[i % len(CITIES)],
                f"{1 + i % 28:02d}/{1 + i % 12:02d}/{1940 + i % 60}",
                f"{i % 1000}.{i % 997:03d},{i % 100:02d}",
                "sim" if i % 3 else "não",
            ]
        )
    return write_csv(tmp_path_factory.mktemp("big") / "clientes.csv", rows)


def count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(clientes)).scalar_one())


def test_killed_halfway_then_run_again_equals_one_clean_run(
    db: sa.Engine, env: dict[str, str], tmp_path: Path, big_csv: Path
) -> None:
    command = [*ONCEONLY, "import", str(big_csv), *KEY, "--batch-size", "1000", "--quiet"]
    process = subprocess.Popen(command, env=env, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while (seen := count(db)) < BIG_ROWS // 5:
        assert process.poll() is None, "the import finished before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    assert process.wait(10) == -signal.SIGKILL
    at_kill = count(db)
    assert seen <= at_kill < BIG_ROWS

    again = run(
        str(big_csv), *KEY, "--batch-size", "1000", "--format", "json", env=env, cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    # What the killed run committed is found unchanged; the rest is new.
    assert report["unchanged"] == at_kill
    assert report["inserted"] == BIG_ROWS - at_kill
    assert (report["updated"], report["rejected"]) == (0, 0)

    fresh = run(
        str(big_csv),
        *KEY[2:],
        "--table",
        "clientes_clean",
        "--format",
        "json",
        env=env,
        cwd=tmp_path,
    )
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout)["inserted"] == BIG_ROWS
    assert count(db) == BIG_ROWS
    with db.connect() as conn:  # the same rows, value for value, both ways
        assert conn.execute(sa.select(clientes).except_(sa.select(clean))).all() == []
        assert conn.execute(sa.select(clean).except_(sa.select(clientes))).all() == []
