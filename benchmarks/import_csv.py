"""Import benchmark: a generated Brazilian CSV upserted into PostgreSQL.

    python benchmarks/import_csv.py [--rows 1000000] [--baseline-rows 20000]
                                    [--batch-size 5000] [--postgres URL]

In one run:

1. generates a CSV of ``--rows`` customers the way a Brazilian Excel export
   writes them: ``;``-separated, Windows-1252, CRLF, CPFs half formatted
   (``123.456.789-09``) and half not, ``dd/mm/yyyy`` dates, ``1.234,56``
   amounts, ``sim``/``não``;
2. the naive baseline: the first ``--baseline-rows`` rows, each parsed and
   checked with the importer's own functions, then one ``INSERT ... ON
   CONFLICT DO UPDATE`` statement and one commit per row (rows/s measured on
   that sample: the baseline is linear, so extrapolating it is fair);
3. ``onceonly import`` as a subprocess into an empty table (all inserted),
   then the same command again (all unchanged), each timed from start to exit,
   with the process's peak memory (max RSS, from ``wait4``).

Goals checked at the end: the import at least 20x the baseline's rows/s, peak
memory under 200 MB, the second run no slower than the first.

PostgreSQL runs against a fresh database ``onceonly_bench_import`` on
``--postgres`` (default postgresql://postgres@127.0.0.1:5432/test), dropped at
the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from onceonly.importer import normalize_cpf
from onceonly.importer.values import parse_bool, parse_date, parse_decimal

FIRST = ["João", "Maria", "José", "Ana", "Antônio", "Francisca", "Carlos", "Conceição", "Luís"]
LAST = ["da Silva", "Santos", "Oliveira", "Souza", "Lima", "Araújo", "Gonçalves", "Ribeiro"]
CITIES = ["São Paulo", "Rio de Janeiro", "Belo Horizonte", "Goiânia", "Maceió", "Florianópolis"]

TABLE = """
CREATE TABLE {name} (
    cpf char(11) PRIMARY KEY,
    nome text NOT NULL,
    cidade text,
    nascimento date,
    limite numeric(12, 2),
    ativo boolean,
    codigo text
)
"""


def cpf(base: int) -> str:
    digits = [int(c) for c in f"{base:09d}"]
    for weights in (range(10, 1, -1), range(11, 1, -1)):
        remainder = sum(d * w for d, w in zip(digits, weights, strict=False)) % 11
        digits.append(0 if remainder < 2 else 11 - remainder)
    return "".join(map(str, digits))


def generate(path: Path, rows: int) -> None:
    rng = random.Random(42)
    with path.open("w", encoding="cp1252", newline="") as f:
        out = csv.writer(f, delimiter=";", lineterminator="\r\n")
        out.writerow(["CPF", "Nome", "Cidade", "Nascimento", "Limite", "Ativo", "Codigo"])
        for i in range(rows):
            number = cpf(100_000_000 + i * 7)
            shown = f"{number[:3]}.{number[3:6]}.{number[6:9]}-{number[9:]}" if i % 2 else number
            amount = f"{rng.randrange(0, 5_000_000) / 100:,.2f}"
            out.writerow(
                [
                    shown,
                    f"{rng.choice(FIRST)} {rng.choice(LAST)}",
                    rng.choice(CITIES),
                    f"{rng.randrange(1, 29):02d}/{rng.randrange(1, 13):02d}/"
                    f"{rng.randrange(1940, 2006)}",
                    amount.replace(",", "_").replace(".", ",").replace("_", "."),
                    "sim" if rng.random() < 0.8 else "não",
                    f"C-{i:07d}",
                ]
            )


def fresh_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLE.format(name="customers"))
        conn.execute(TABLE.format(name="customers_naive"))
    return url


def naive(url: str, path: Path, rows: int) -> float:
    """One statement and one commit per row: rows/s."""
    sql = (
        "INSERT INTO customers_naive AS t (cpf, nome, cidade, nascimento, limite, ativo, codigo) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (cpf) DO UPDATE SET "
        "nome = excluded.nome, cidade = excluded.cidade, nascimento = excluded.nascimento, "
        "limite = excluded.limite, ativo = excluded.ativo, codigo = excluded.codigo "
        "WHERE (t.nome, t.cidade, t.nascimento, t.limite, t.ativo, t.codigo) IS DISTINCT FROM "
        "(excluded.nome, excluded.cidade, excluded.nascimento, excluded.limite, excluded.ativo, "
        "excluded.codigo)"
    )
    with psycopg.connect(url) as conn, path.open(encoding="cp1252", newline="") as f:
        reader = csv.reader(f, delimiter=";")
        next(reader)
        started = time.perf_counter()
        for n, (key, nome, cidade, nascimento, limite, ativo, codigo) in enumerate(reader):
            if n == rows:
                break
            conn.execute(
                sql,
                (
                    normalize_cpf(key),
                    nome,
                    cidade,
                    parse_date(nascimento),
                    parse_decimal(limite),
                    parse_bool(ativo),
                    codigo,
                ),
            )
            conn.commit()
        return rows / (time.perf_counter() - started)


def run_import(url: str, path: Path, batch_size: int) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "onceonly.cli", "import", str(path),
        "--table", "customers", "--key", "cpf", "--key-type", "cpf",

        "--database-url", url, "--batch-size", str(batch_size), "--format", "json", "--quiet",
    ]  # fmt: skip
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"import failed with status {process.returncode}:\n{output}")
    report: dict[str, Any] = json.loads(output)
    rows = report["rows"]
    return {
        "seconds": round(seconds, 2),
        "rows_per_second": round(rows / seconds),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux: kilobytes
        "inserted": report["inserted"],
        "updated": report["updated"],
        "unchanged": report["unchanged"],
        "rejected": report["rejected"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--baseline-rows", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "clientes.csv"
        started = time.perf_counter()
        generate(path, args.rows)
        size_mb = path.stat().st_size / 2**20
        print(
            f"generated {args.rows:,} rows, {size_mb:.1f} MiB, "
            f"in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
        url = fresh_database(args.postgres, "onceonly_bench_import")
        baseline = naive(url, path, min(args.baseline_rows, args.rows))
        print(
            f"naive baseline: {baseline:,.0f} rows/s "
            f"(one statement and commit per row, {args.baseline_rows:,} rows)",
            flush=True,
        )
        first = run_import(url, path, args.batch_size)
        print(f"first import:  {json.dumps(first)}", flush=True)
        second = run_import(url, path, args.batch_size)
        print(f"second import: {json.dumps(second)}", flush=True)
        if not args.keep:
            with psycopg.connect(args.postgres, autocommit=True) as conn:
                conn.execute('DROP DATABASE "onceonly_bench_import" WITH (FORCE)')

    speedup = first["rows_per_second"] / baseline
    goals = {
        "at least 20x the naive baseline": speedup >= 20,
        "peak memory under 200 MB": max(first["peak_rss_mb"], second["peak_rss_mb"]) < 200,
        "second run no slower than the first": second["seconds"] <= first["seconds"],
        "second run all unchanged": second["unchanged"] == args.rows,
    }
    print(f"speed-up over the naive baseline: {speedup:.1f}x")
    for goal, met in goals.items():
        print(f"  [{'met' if met else 'MISSED'}] {goal}")
    if not all(goals.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
