"""The upgrades from every older version run on SQLite and on a private 3-node cluster; by
default the cluster runs those from the oldest version (every migration step, in order) and
from the newest (the step a user of the last release takes), the others in the slow tier
(`make test-all`): the migration's statements are the same on both backends, and each test
starts a cluster of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

_VERSIONS = sorted(
    (p.stem for p in (Path(__file__).parent / "fixtures").glob("v*.db")), key=lambda v: int(v[1:])
)
ON_A_CLUSTER_BY_DEFAULT = {_VERSIONS[0], _VERSIONS[-1]}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (
            callspec is None
            or item.module is None
            or item.module.__name__ != __package__ + ".test_upgrade"
        ):
            continue
        version = callspec.params.get("version")
        if callspec.params.get("open_v1") == "rqlite3" and version not in ON_A_CLUSTER_BY_DEFAULT:
            item.add_marker(pytest.mark.slow)
