"""Files of another project's source distribution, for running its own tests against ours: the
installed release's sdist, downloaded from the package index once into the user cache (never
copied into this repository), read from the archive."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from importlib.metadata import version

import pytest

from rqlite_queue.rqlited import cache_dir


def sdist_files(package: str, paths: list[str], *, timeout: float = 300) -> dict[str, str]:
    """The text of each of `paths` (relative to the archive's top folder) in the sdist of the
    installed `package`'s release."""
    release = version(package)
    name = package.lower()
    where = cache_dir() / f"{name}-sdist"
    archive = where / f"{name}-{release}.tar.gz"
    if not archive.exists():
        where.mkdir(parents=True, exist_ok=True)
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"{package}=={release}", "-d", str(where)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )  # fmt: skip
        if got.returncode != 0 or not archive.exists():
            pytest.fail(f"could not download {package} {release}'s sdist: {got.stderr[-2000:]}")
    files = {}
    with tarfile.open(archive) as sdist:
        for path in paths:
            member = sdist.extractfile(f"{name}-{release}/{path}")
            assert member is not None, f"{path} is not in {archive.name}"
            files[path] = member.read().decode()
    return files
