"""``onceonly serve --workers N``: what is refused before anything starts, and how a
process that ended is told."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from onceonly.cli import main


def serve(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["serve", *args], env={"ONCEONLY_APP": None})
    return result.exit_code, " ".join(result.output.split())


def test_several_processes_on_sqlite_are_refused_with_the_reason(tmp_path: Path) -> None:
    database = tmp_path / "onceonly.db"
    code, output = serve("--workers", "2", "--database-url", f"sqlite:///{database}")
    assert code == 2
    assert "--workers 2 needs PostgreSQL" in output
    assert "one writer per database file" in output
    assert "group commit" in output
    assert "use PostgreSQL" in output
    # Refused before opening anything: no database file appeared.
    assert not database.exists()


def test_the_in_process_worker_is_refused_with_several_processes(tmp_path: Path) -> None:
    url = "postgresql://nobody@127.0.0.1:1/none"
    code, output = serve("--workers", "2", "--worker", "--database-url", url)
    assert code == 2
    assert "run `onceonly worker` as its own process" in output


def test_help_says_what_workers_does_and_that_sqlite_is_refused() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"])
    text = " ".join(result.output.split())
    assert "--workers N" in text
    assert "Receiver processes sharing the port" in text
    assert "PostgreSQL only (refused on SQLite" in text


def test_how_a_serve_process_ended_is_said_in_words() -> None:
    from onceonly.cli.processes import how_it_ended

    assert how_it_ended(-9) == "was killed by SIGKILL"
    assert how_it_ended(1) == "exited with status 1"
    assert how_it_ended(None) == "is still running"
    assert how_it_ended(-200) == "was killed by signal 200"
