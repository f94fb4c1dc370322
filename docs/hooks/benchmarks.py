"""A mkdocs hook: BENCHMARKS.md (at the repository's root, where `make bench` readers find it)
becomes the site's page `benchmarks.md`, with the files it links to (results pages, plots, the
benchmarks' sources), and the files those results pages link to, carried along at the same
paths: its links work on GitHub and in the site alike."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def _targets(text: str, base: str) -> set[str]:
    """The repository files `text` (a file in directory `base`) links to."""
    found = set()
    for match in LINK.finditer(text):
        target = match.group(1)
        if "://" in target or target.startswith(("mailto:", "docs/")):
            continue
        path = posixpath.normpath(posixpath.join(base, target))
        if (ROOT / path).is_file():
            found.add(path)
    return found


def on_files(files: Files, config: Any) -> Files:
    text = (ROOT / "BENCHMARKS.md").read_text()
    page = LINK.sub(
        lambda m: (
            f"]({m.group(1).removeprefix('docs/')}{m.group(2) or ''})"
            if m.group(1).startswith("docs/")
            else m.group(0)
        ),
        text,
    )
    files.append(File.generated(config, "benchmarks.md", content=page))
    todo, carried = _targets(text, ""), set()
    while todo:
        path = todo.pop()
        carried.add(path)
        if path.endswith(".md"):
            linked = _targets((ROOT / path).read_text(), posixpath.dirname(path))
            todo |= linked - carried
    for path in sorted(carried):
        if files.get_file_from_path(path) is None:
            files.append(File.generated(config, path, abs_src_path=str(ROOT / path)))
    return files
