"""Finding, checking and building the rqlited binary that local clusters run.

One code path for everyone: `rqlite-queue rqlited` (what the Makefile and CI call), `cluster up`,
the demo and the pytest plugin all go through `find_rqlited`. The build recipe lives here, in the
package, so that a wheel user with Go gets the same binary a checkout gets.

Versions. The library needs rqlite v8's HTTP API with linearizable reads done right (v8.32.2,
rqlite PR #1944) and SQLite's RETURNING (v8.23). v9 and later bundle an extension under a licence
that is not open source: refused. Every v8 release from `MINIMUM` on is accepted; the ones in
`TESTED` are those the test suite has run on, the others are used with a warning.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import QueueError

__all__ = [
    "BUILD_VERSION",
    "MINIMUM",
    "TESTED",
    "RqlitedInfo",
    "RqlitedNotFound",
    "build_rqlited",
    "cache_dir",
    "check_rqlited",
    "find_rqlited",
    "how_to_get_rqlited",
    "judge_version",
    "parse_version",
]

Version = tuple[int, int, int]

MINIMUM: Version = (8, 32, 2)
TESTED: tuple[Version, ...] = ((8, 43, 4),)
# What `rqlite-queue rqlited` builds when none is found: the newest tested release.
BUILD_VERSION: Version = max(TESTED)
_MODULE = "github.com/rqlite/rqlite/v8"


class RqlitedNotFound(QueueError):
    """No usable rqlited: missing, not runnable, or a version this library refuses."""


@dataclass(frozen=True)
class RqlitedInfo:
    """A usable rqlited: where it is, what it reports, and whether that release was tested."""

    path: str
    version: Version | None  # None: a build that reports only "8" (no version stamped in)
    warning: str | None  # why this one is used with care (untested release, unknown version)

    @property
    def label(self) -> str:
        return vstr(self.version) if self.version else "v8 (release unknown)"


def vstr(version: Version) -> str:
    return "v" + ".".join(map(str, version))


def parse_version(text: str) -> Version | tuple[int] | None:
    """The version in `rqlited -version`'s output: (8, 43, 4) from "rqlited v8.43.4 linux...",
    (8,) from a build that was not stamped (it prints "rqlited 8 ..."), None if neither."""
    match = re.search(r"\brqlited\s+v?(\d+)(?:\.(\d+)\.(\d+))?\b", text)
    if match is None:
        return None
    major, minor, patch = match.groups()
    if minor is None:
        return (int(major),)
    return (int(major), int(minor), int(patch))


def judge_version(version: Version | tuple[int] | None) -> tuple[bool, str | None]:
    """(usable, reason): the reason is why it is refused, or the warning it is used with."""
    tested = ", ".join(vstr(v) for v in TESTED)
    if version is None:
        return False, "it does not print a version like 'rqlited v8.43.4'"
    if version[0] >= 9:
        return False, (
            f"{'.'.join(map(str, version))} is v9 or later, which bundles an extension under a "
            "licence that is not open source; use a v8 release"
        )
    if version[0] < 8:
        return False, f"v{version[0]} predates rqlite v8's API, which this library speaks"
    if len(version) == 1:
        return True, f"it reports only '8' (not stamped with its release); tested: {tested}"
    full: Version = (version[0], version[1], version[2])
    if full < MINIMUM:
        return False, (
            f"{vstr(full)} is older than {vstr(MINIMUM)}, the first v8 release whose "
            "linearizable reads this library relies on"
        )
    if full not in TESTED:
        return True, f"{vstr(full)} is a v8 release this library was not tested on ({tested})"
    return True, None


def check_rqlited(path: str | os.PathLike[str]) -> RqlitedInfo:
    """Run `path -version` and judge it; RqlitedNotFound says exactly why it is unusable."""
    path = str(path)
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise RqlitedNotFound(f"{path} is not an executable file")
    try:
        out = subprocess.run(
            [path, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RqlitedNotFound(f"cannot run {path} -version: {exc}") from exc
    text = (out.stdout + out.stderr).strip()
    version = parse_version(text)
    usable, reason = judge_version(version)
    if not usable:
        raise RqlitedNotFound(f"{path} is refused: {reason} (it says {text[:120]!r})")
    full = version if version is not None and len(version) == 3 else None
    return RqlitedInfo(path=path, version=full, warning=reason)


def cache_dir() -> Path:
    """Where built binaries are kept: $RQLITE_QUEUE_CACHE, else $XDG_CACHE_HOME/rqlite-queue,
    else ~/.cache/rqlite-queue; each release in its own folder, the binary named plain
    `rqlited` (so that `pgrep -x rqlited` finds its processes)."""
    explicit = os.environ.get("RQLITE_QUEUE_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rqlite-queue"


def cached_path(version: Version = BUILD_VERSION) -> Path:
    return cache_dir() / vstr(version) / "rqlited"


def how_to_get_rqlited() -> str:
    """The ways to get an rqlited, in one message (what a user without one reads)."""
    v = vstr(BUILD_VERSION)
    return (
        f"Get an rqlited v8 (tested: {v}; accepted: {vstr(MINIMUM)} and later v8 releases; "
        "never v9+) in one of four ways:\n"
        "  1. with Go (1.24+) and a C compiler: `rqlite-queue rqlited` builds it from rqlite's "
        "Go module into the cache;\n"
        f"  2. rqlite's release binary: download rqlite-{v}-linux-amd64.tar.gz from "
        f"https://github.com/rqlite/rqlite/releases/tag/{v} and unpack it;\n"
        f"  3. rqlite's Docker image: docker run -p 4001:4001 rqlite/rqlite:{v[1:]} (then give "
        "--url http://127.0.0.1:4001; or copy /bin/rqlited out of the image with docker cp);\n"
        "  4. a package manager (e.g. Homebrew's rqlite), if it offers a v8 release;\n"
        "then put rqlited on PATH or set RQLITED=/path/to/rqlited."
    )


def find_rqlited(*, build: bool = False, log: Callable[[str], None] | None = None) -> RqlitedInfo:
    """A usable rqlited: $RQLITED if set (and only it), else the cache, else PATH; with
    `build`, one is built from rqlite's Go module when none of those is usable and Go is here.

    Raises RqlitedNotFound with every place looked at, why each was refused, and the other
    ways to get one."""
    explicit = os.environ.get("RQLITED")
    if explicit:
        try:
            return check_rqlited(explicit)
        except RqlitedNotFound as exc:
            raise RqlitedNotFound(
                f"RQLITED: {exc}; unset RQLITED to look in the cache and PATH "
                "(`rqlite-queue rqlited` finds or builds one there)"
            ) from exc
    refused: list[str] = []
    candidates: list[str] = []
    cache = cache_dir()
    if cache.is_dir():  # the default build first, then any other release built into the cache
        preferred = cached_path()
        others = sorted(cache.glob("v8.*/rqlited"), reverse=True)
        candidates += [str(p) for p in [preferred, *others] if p.is_file()]
    on_path = shutil.which("rqlited")
    if on_path:
        candidates.append(on_path)
    for candidate in dict.fromkeys(candidates):
        try:
            return check_rqlited(candidate)
        except RqlitedNotFound as exc:
            refused.append(str(exc))
    looked = f"looked in $RQLITED (unset), {cache} and PATH"
    detail = "".join(f"\n  refused: {r}" for r in refused)
    if build and shutil.which("go"):
        if log is not None:
            log(f"no usable rqlited ({looked}){detail}")
        return check_rqlited(build_rqlited(BUILD_VERSION, log=log))
    why = "" if build else " (`rqlite-queue rqlited` builds one when Go is installed)"
    no_go = "; Go is not installed, so it cannot be built here" if build else ""
    how = how_to_get_rqlited()
    raise RqlitedNotFound(f"no usable rqlited: {looked}{no_go}{why}{detail}\n{how}")


def build_rqlited(
    version: Version = BUILD_VERSION, *, log: Callable[[str], None] | None = None
) -> str:
    """Build rqlited `version` from rqlite's Go module into the cache; returns its path.

    Built inside a writable copy of rqlite's own module, so that its go.mod `replace` lines and
    go.sum apply (a module that merely requires rqlite ignores them, and resolution fails), with
    the version stamped in as rqlite's own packaging does. Needs Go and a C compiler (cgo:
    SQLite). Go's module and build caches make every build after the first one quick."""
    usable, reason = judge_version(version)
    if not usable or version not in TESTED:
        raise RqlitedNotFound(f"will not build {vstr(version)}: {reason or 'untested'}")
    go = shutil.which("go")
    if go is None:
        raise RqlitedNotFound("Go is not installed: cannot build rqlited\n" + how_to_get_rqlited())
    out = cached_path(version)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "1", "GOFLAGS": "-mod=mod"}
    tag = vstr(version)

    def run(args: list[str], cwd: str | None = None) -> str:
        proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RqlitedNotFound(
                f"building rqlited {tag} failed: `{' '.join(args)}` exited {proc.returncode}:\n"
                + (proc.stderr or proc.stdout).strip()[-2000:]
            )
        return proc.stdout

    if log is not None:
        log(f"building rqlited {tag} from {_MODULE} (the first build takes a few minutes)")
    meta = json.loads(run([go, "mod", "download", "-json", f"{_MODULE}@{tag}"]))
    source = meta.get("Dir")
    if not source:
        raise RqlitedNotFound(f"go mod download {_MODULE}@{tag}: {meta.get('Error', 'no Dir')}")
    with tempfile.TemporaryDirectory(prefix="rqlited-build-") as work:
        # copyfile: the module cache's files are read-only, their copies need not be.
        shutil.copytree(source, work, dirs_exist_ok=True, copy_function=shutil.copyfile)
        for root, dirs, _ in os.walk(work):
            os.chmod(root, 0o755)
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
        ldflags = f"-s -w -X {_MODULE}/cmd.Version={tag}"
        tmp = f"{out}.tmp"
        run([go, "build", "-trimpath", "-ldflags", ldflags, "-o", tmp, "./cmd/rqlited"], work)
    os.replace(tmp, out)
    if log is not None:
        log(f"built {out}")
    return str(out)
