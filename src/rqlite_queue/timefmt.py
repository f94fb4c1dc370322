"""Times and durations as the command line and the dashboard show them."""

from __future__ import annotations

import time


def duration(seconds: float) -> str:
    """`12.5s`, `3.2m`, `5.0h`, `2.1d`."""
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def utc(epoch: float) -> str:
    """`2026-11-30 11:48:25 UTC`."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))
