"""Each provider has its documentation page, linked from the index, and the
code in those pages is at least valid Python."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from onceonly.providers import PROVIDER_CLASSES

DOCS = Path(__file__).resolve().parents[3] / "docs"


@pytest.mark.parametrize("name", sorted(PROVIDER_CLASSES))
def test_every_provider_has_a_page_linked_from_the_index(name: str) -> None:
    page = DOCS / "providers" / f"{name}.md"
    assert page.is_file(), f"docs/providers/{name}.md is missing"
    assert f"(providers/{name}.md)" in (DOCS / "providers.md").read_text(encoding="utf-8")
    text = page.read_text(encoding="utf-8")
    for section in (
        "## Configure",
        "## What is signed",
        "## Event id",
        "## Retries",
        "## Unsigned messages",
        "## Handler",
    ):
        assert section in text, f"{name}.md has no {section!r} section"


@pytest.mark.parametrize("page", sorted((DOCS / "providers").glob("*.md")), ids=lambda p: p.stem)
def test_python_examples_parse(page: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)
    assert blocks
    for block in blocks:
        ast.parse(block)
