"""``alembic revision --autogenerate`` in a project sharing its database with onceonly.

A real Alembic project in a temporary directory (``alembic init``, then the
``env.py`` printed in ``docs/alembic.md``), a database onceonly has migrated
that also holds the project's ``orders`` table, and models that add a
``refunds`` table. The real command runs in a subprocess; the revision it
writes is read back. With the documented filter the revision creates
``refunds`` and touches nothing else; without it, it drops onceonly's tables,
which is the failure the filter exists for; with ``metadata_for`` in
``target_metadata`` instead, it also creates only ``refunds``.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onceonly.db import create_engine
from onceonly.store import migrate_blocking
from onceonly.store.schema import describe

DOC = Path(__file__).resolve().parents[2] / "docs" / "alembic.md"
FILTER_LINE = "include_name=include_name,  # onceonly"

# The project's models: `orders` is already in the database, `refunds` is new.
MODELS = """
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    total_cents: Mapped[int] = mapped_column(sa.Integer)


class Refund(Base):
    __tablename__ = "refunds"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(sa.ForeignKey("orders.id"))
"""


def _documented(marker: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"<!-- example: {marker} -->\s*```python\n(.*?)```", text, re.DOTALL)
    assert match, f"docs/alembic.md lost its {marker} block"
    return match.group(1)


def _alembic(project: Path, *args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(project)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _sqlalchemy_url(database_url: str) -> str:
    # psycopg (3) is the driver installed with onceonly; SQLAlchemy's default
    # for postgresql:// is psycopg2.
    return database_url.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture(scope="module")
def initialised(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``alembic init migrations`` makes, once for the module (each test copies it)."""
    project = tmp_path_factory.mktemp("alembic-init")
    _alembic(project, "init", "migrations")
    return project


def _project(initialised: Path, tmp_path: Path, database_url: str, env_py: str) -> Path:
    project = tmp_path / "project"
    shutil.copytree(initialised, project)
    ini = project / "alembic.ini"
    text = ini.read_text(encoding="utf-8")
    url = _sqlalchemy_url(database_url)
    assert "driver://user:pass@localhost/dbname" in text
    ini.write_text(text.replace("driver://user:pass@localhost/dbname", url), encoding="utf-8")
    (project / "myproject").mkdir()
    (project / "myproject" / "__init__.py").write_text("", encoding="utf-8")
    (project / "myproject" / "models.py").write_text(MODELS, encoding="utf-8")
    (project / "migrations" / "env.py").write_text(env_py, encoding="utf-8")
    return project


def _operations(project: Path) -> set[tuple[str, str]]:
    """``alembic revision --autogenerate``'s upgrade(), as (operation, table) pairs."""
    _alembic(project, "revision", "--autogenerate", "-m", "refunds")
    (revision,) = (project / "migrations" / "versions").glob("*.py")
    tree = ast.parse(revision.read_text(encoding="utf-8"))
    (upgrade,) = (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "upgrade")
    found = set()
    for node in ast.walk(upgrade):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "op"
            and node.func.attr != "f"
        ):
            continue
        table = next((k.value for k in node.keywords if k.arg == "table_name"), None)
        if table is None and node.args:
            table = node.args[0]
        assert isinstance(table, ast.Constant), ast.dump(node)
        found.add((node.func.attr, str(table.value)))
    return found


@pytest.fixture
def shared_database(database_url: str) -> str:
    """A database onceonly has migrated, holding the project's existing table too."""
    migrate_blocking(database_url)
    engine = create_engine(database_url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TABLE orders (id INTEGER NOT NULL PRIMARY KEY,"
                " total_cents INTEGER NOT NULL)"
            )
    finally:
        engine.dispose()
    return database_url


def test_with_the_filter_autogenerate_leaves_onceonly_tables_alone(
    shared_database: str, initialised: Path, tmp_path: Path
) -> None:
    env_py = _documented("env.py")
    assert env_py.count(FILTER_LINE) == 2
    project = _project(initialised, tmp_path, shared_database, env_py)
    assert _operations(project) == {("create_table", "refunds")}


def test_without_the_filter_autogenerate_drops_onceonly_tables(
    shared_database: str, initialised: Path, tmp_path: Path, engine: str
) -> None:
    env_py = _documented("env.py").replace(FILTER_LINE, "")
    project = _project(initialised, tmp_path, shared_database, env_py)
    operations = _operations(project)
    assert ("drop_table", "onceonly_events") in operations
    dropped = {table for op, table in operations if op == "drop_table"}
    assert dropped == set(describe(engine).tables)
    assert ("create_table", "refunds") in operations


def test_with_the_description_autogenerate_proposes_nothing_for_onceonly(
    shared_database: str, initialised: Path, tmp_path: Path
) -> None:
    target = _documented("target_metadata")
    env_py = _documented("env.py").replace(FILTER_LINE, "")
    env_py = env_py.replace("target_metadata = Base.metadata\n", target)
    assert "metadata_for" in env_py
    project = _project(initialised, tmp_path, shared_database, env_py)
    assert _operations(project) == {("create_table", "refunds")}
