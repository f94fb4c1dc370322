"""Names of queues made from other systems' names (a kombu queue, a Django Tasks queue): the
queue's own names are 1-40 lower-case letters, digits or `_`."""

from __future__ import annotations

import hashlib
import re

_NOT_A_NAME = re.compile(r"[^a-z0-9_]")


def queue_name_for(name: str, prefix: str = "") -> str:
    """The queue that holds the outside queue `name`: the name itself when it is 1-40
    lower-case letters, digits or `_`; otherwise made into one, with a hash of the original
    (so that two outside names never share a queue)."""
    full = prefix + name
    plain = _NOT_A_NAME.sub("_", full.lower())
    if plain == full and 0 < len(full) <= 40:
        return full
    digest = hashlib.blake2b(full.encode(), digest_size=4).hexdigest()
    return f"{plain[:31]}_{digest}"
