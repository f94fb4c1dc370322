"""docs/reference/configuration.md's tables of the integrations' options against the options
the code reads (an option added without its row fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md").read_text()


def table(heading: str) -> dict[str, str]:
    body = re.split(r"\n#{2,3} ", PAGE.split(f"\n### {heading}\n", 1)[1], maxsplit=1)[0]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`"):
            rows[cells[0]] = cells[1]
    return rows


def test_the_kombu_transport_options_are_documented() -> None:
    kombu = pytest.importorskip("rqlite_queue.kombu")
    rows = table("kombu transport options")
    given = ", ".join(f"`{name}`" for name in kombu.QUEUE_OPTIONS)
    assert rows.pop(given) == "the queue's"
    assert rows == {f"`{k}`": f"`{v!r}`" for k, v in kombu.TRANSPORT_OPTIONS.items()}


def test_the_django_options_are_documented() -> None:
    pytest.importorskip("django")
    from rqlite_queue.django.backend import BACKEND_OPTIONS

    rows = table("Django OPTIONS")
    assert rows == {f"`{k}`": f"`{v!r}`" for k, v in BACKEND_OPTIONS.items()}
