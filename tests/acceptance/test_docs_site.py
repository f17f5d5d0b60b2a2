"""The documentation site builds with MkDocs in strict mode: no broken links or anchors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_docs_build_strictly(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "guarantees" / "index.html").exists()
    nav_pages = (tmp_path / "index.html").read_text(encoding="utf-8")
    for title in ("Quickstart", "The guarantees", "Idempotency-Key", "Operations", "Benchmarks"):
        assert title in nav_pages
