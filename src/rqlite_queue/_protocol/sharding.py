"""Groups spread over several clusters (shards): where a group lives, and how the shards'
answers combine. Pure functions, no I/O; the shard router (`_async/shards.py`) runs them.

A group lives on exactly one shard, chosen by rendezvous (highest random weight) hashing of its
id over the shards' *names*: each shard scores the group with a hash of (name, group id) and the
highest score wins. Adding a shard moves only the groups it now wins (about 1/(K+1) of them),
removing one moves only its own, and the order in which shards are listed moves nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..errors import InvalidArgument, ShardDown
from ..types import (
    BatchStatus,
    DeadLetter,
    GroupInfo,
    Lease,
    Probe,
    Round,
    Schedule,
    ShardStatus,
    Stats,
    TenantInfo,
)
from .checks import show
from .http import unknown_scheme
from .messages import NewMessage, scoped_dedup_id
from .retry import PROBE
from .round_spec import FINISH, CheckedRound, Settlement
from .shard_tables import OutboxRow

T = TypeVar("T")

SHARD_NAME = re.compile(r"[a-z0-9][a-z0-9_.:-]{0,62}")
SEPARATOR = ";"


ACTIVE, JOINING, DRAINING = "active", "joining", "draining"


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """One shard: its name (what groups hash on), its backend URL (a cluster's nodes,
    comma-separated, or an SQLite file), and its part in a change of the list: `joining`
    (`+name=`: takes the groups it wins once their old shard has delivered what it holds) or
    `draining` (`-name=`: takes no new group; its groups move once they are empty there)."""

    name: str
    url: str
    state: str = ACTIVE


@dataclass(frozen=True, slots=True)
class ShardList:
    """The shards of a queue and the list's epoch: raised with each change of the list
    (`epoch=N;...`), so that a client with an older list cannot publish where it would break
    a group (see `docs/sharding.md`)."""

    specs: tuple[ShardSpec, ...]
    epoch: int = 0

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    @property
    def changing(self) -> bool:
        return any(s.state != ACTIVE for s in self.specs)

    def shard_of(self, group_id: str) -> str:
        """The shard that takes the group's new messages (see `placement`)."""
        return self.placement(group_id)[0]

    def shard_of_lease(self, lease: Lease) -> str:
        """The shard a lease was taken on (`Lease.shard`, or its group's shard)."""
        if lease.shard:
            if lease.shard not in self.names:
                raise InvalidArgument(f"the lease is from shard {lease.shard!r}, not one of these")
            return lease.shard
        return self.shard_of(lease.group_id)

    def left_old_shard(self, leases: Iterable[Lease]) -> set[str]:
        """The moving groups these finished leases took a message of off their old shard:
        once they have none left there, their new shard may serve them."""
        groups = set()
        for lease in leases:
            target, previous = self.placement(lease.group_id)
            if lease.shard and lease.shard == previous != target:
                groups.add(lease.group_id)
        return groups

    def leaving(self, name: str, groups: Iterable[GroupInfo]) -> int:
        """How many of these groups of shard `name` have messages there but belong elsewhere."""
        return sum(1 for g in groups if g.depth and self.shard_of(g.group_id) != name)

    def state(self, name: str) -> str:
        return next((s.state for s in self.specs if s.name == name), ACTIVE)

    def placement(self, group_id: str) -> tuple[str, str]:
        """(target, previous): the shard that takes the group's new messages once it has
        none elsewhere, and the shard it lived on before the change under way (the same one
        for a group that does not move)."""
        target = home(group_id, [s.name for s in self.specs if s.state != DRAINING])
        before = [s.name for s in self.specs if s.state != JOINING]
        return target, home(group_id, before) if before else target


def check_shard_name(name: object) -> str:
    if not isinstance(name, str) or not SHARD_NAME.fullmatch(name):
        raise InvalidArgument(
            f"shard name {name!r}: use 1-63 of a-z, 0-9, '_', '.', ':', '-' "
            "(starting with a letter or digit)"
        )
    return name


_SHARD_PART = re.compile(r"\s*(epoch=|[+-]?([a-z0-9][a-z0-9_.:-]*=)?(https?|sqlite)://)")
_NAMED = re.compile(r"\s*[+-]?[a-z0-9][a-z0-9_.:-]*=(https?|sqlite)://")


SCHEMES = ("http://", "https://", "sqlite://")


def is_sharded_url(url: str) -> bool:
    """A shard list: parts separated by `;`, each a URL (optionally `name=`, `+name=`,
    `-name=`) or `epoch=N`; or a single named URL. (A `;` inside one URL, say in a password,
    does not make it a shard list.)"""
    parts = url.split(SEPARATOR)
    if len(parts) == 1:
        return bool(_NAMED.match(url))
    return all(_SHARD_PART.match(part) for part in parts if part.strip())


def parse_shard_list(url: str) -> ShardList:
    """`epoch=2;a=http://h1:4001,http://h2:4001;b=http://h3:4001;+c=http://h4:4001`: clusters
    separated by `;`, each optionally named `name=`, marked `+` (joining) or `-` (draining)
    while the list changes; `epoch=N` (default 0) is raised with each change. An unnamed shard
    is named after its first node (`h3:4001`): name your shards if that address may change,
    since a new name moves the shard's groups."""
    if not isinstance(url, str):
        raise InvalidArgument(f"not a URL: {type(url).__name__}")
    specs: list[ShardSpec] = []
    epoch: int | None = None
    for part in url.split(SEPARATOR):
        part = part.strip()
        if not part:
            raise InvalidArgument("an empty shard in the shard list (two ';' in a row?)")
        if part.startswith("epoch="):
            if epoch is not None or not part[6:].isdigit() or len(part) > 18:
                raise InvalidArgument(f"{part!r}: give one epoch=N, N a whole number")
            epoch = int(part[6:])
            continue
        state = {"+": JOINING, "-": DRAINING}.get(part[0], ACTIVE)
        if state != ACTIVE:
            part = part[1:]
        name, sep, rest = part.partition("=")
        if sep and "://" not in name:
            check_shard_name(name)
            shard_url = rest.strip()
        else:
            if not part.startswith(SCHEMES):
                raise unknown_scheme(part)
            shard_url, name = part, _default_name(part)
        if not shard_url.startswith(SCHEMES):
            raise InvalidArgument(f"shard {name!r}: {unknown_scheme(shard_url)}")
        specs.append(ShardSpec(name, shard_url, state))
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidArgument(f"shard names must differ: {', '.join(duplicates)} repeated")
    if not specs:
        raise InvalidArgument("a shard list needs at least one shard")
    if all(s.state == DRAINING for s in specs):
        raise InvalidArgument("every shard is draining: no shard would take new groups")
    shard_list = ShardList(tuple(specs), epoch or 0)
    if shard_list.changing and not shard_list.epoch:
        raise InvalidArgument(
            "a list with joining (+) or draining (-) shards needs epoch=N, higher than the "
            "epoch of the list before it"
        )
    return shard_list


def _default_name(url: str) -> str:
    first = url.split(",")[0]
    if first.startswith("sqlite://"):
        raise InvalidArgument("an SQLite shard needs a name: name=sqlite:///path.db")
    try:
        parts = urlsplit(first)
        host = parts.hostname or ""
        name = f"{host}:{parts.port}" if parts.port else host
    except ValueError:  # a bad port: said without the URL, which may hold a password
        name = ""
    if not SHARD_NAME.fullmatch(name):
        raise InvalidArgument(
            "cannot name a shard after its first node's address: give it a name (name=URL)"
        )
    return name


def _score(name: str, group_id: str) -> int:
    key = name.encode() + b"\0" + group_id.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def ranking(group_id: str, names: Iterable[str]) -> list[str]:
    """The shards in the group's order of preference: its home first."""
    return sorted(names, key=lambda name: (_score(name, group_id), name), reverse=True)


def home(group_id: str, names: Sequence[str]) -> str:
    """The shard the group lives on."""
    return max(names, key=lambda name: (_score(name, group_id), name))


def split_by_shard(items: Sequence[T], shard_of: Callable[[T], str]) -> dict[str, list[int]]:
    """Which items (by index) go to which shard, in their order."""
    parts: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        parts.setdefault(shard_of(item), []).append(index)
    return parts


def in_given_order(given: Sequence[T], parts: Iterable[Sequence[T]]) -> list[T]:
    """The settlements the shards reported lost (each part: one shard's, in its order), in the
    order of `given`, all shards' settlements together. Matched by identity; of a lease given
    several times, the lost ones are its last occurrences (the first one that held applied)."""
    positions: dict[int, list[int]] = {}
    for index, item in enumerate(given):
        positions.setdefault(id(item), []).append(index)
    counts: dict[int, int] = {}
    objects: dict[int, T] = {}
    for part in parts:
        for item in part:
            counts[id(item)] = counts.get(id(item), 0) + 1
            objects[id(item)] = item
    placed = [
        (index, objects[key])
        for key, count in counts.items()
        for index in positions.get(key, [len(given)] * count)[-count:]
    ]
    placed.sort(key=lambda pair: pair[0])
    return [item for _, item in placed]


def rotation(names: Sequence[str], start: int) -> list[str]:
    """The shards from `start` (mod K) on, wrapping around: where claims begin rotates."""
    k = start % len(names)
    return [*names[k:], *names[:k]]


def shares(n: int, names: Sequence[str]) -> dict[str, int]:
    """`n` claims spread over the shards as evenly as possible, the first ones getting the
    remainder (callers rotate the order)."""
    base, extra = divmod(n, len(names))
    return {name: base + (1 if i < extra else 0) for i, name in enumerate(names)}


def merge_probes(probes: Iterable[Probe]) -> Probe:
    """Claimable if any shard is; the earliest due time and tick of them all."""
    probes = list(probes)
    dues = [p.next_due for p in probes if p.next_due is not None]
    ticks = [p.next_tick for p in probes if p.next_tick is not None]
    return Probe(
        claimable=any(p.claimable for p in probes),
        next_due=min(dues) if dues else None,
        next_tick=min(ticks) if ticks else None,
    )


def merge_stats(stats: Iterable[Stats]) -> Stats:
    """The queue's totals over its shards. `oldest_age` is the oldest of all; `paused` holds if
    any shard is paused; `last_seq` sums how many messages each shard was ever given."""
    stats = list(stats)
    ages = [s.oldest_age for s in stats if s.oldest_age is not None]
    by_priority: dict[int, int] = {}
    oldest_by_priority: dict[int, float] = {}
    for s in stats:
        for priority, count in s.by_priority.items():
            by_priority[priority] = by_priority.get(priority, 0) + count
        for priority, age in s.oldest_by_priority.items():
            oldest_by_priority[priority] = max(age, oldest_by_priority.get(priority, age))
    return Stats(
        depth=sum(s.depth for s in stats),
        groups=sum(s.groups for s in stats),
        in_flight=sum(s.in_flight for s in stats),
        parked=sum(s.parked for s in stats),
        dead=sum(s.dead for s in stats),
        oldest_age=max(ages) if ages else None,
        by_priority=by_priority,
        held=sum(s.held for s in stats),
        delayed=sum(s.delayed for s in stats),
        expired=sum(s.expired for s in stats),
        paused=any(s.paused for s in stats),
        last_seq=sum(s.last_seq for s in stats),
        outbox=sum(s.outbox for s in stats),
        outcomes=sum(s.outcomes for s in stats),
        tenants_on=any(s.tenants_on for s in stats),
        delayed_groups=sum(s.delayed_groups for s in stats),
        oldest_by_priority=dict(sorted(oldest_by_priority.items())),
        open_batches=sum(s.open_batches for s in stats),
    )


def merge_sorted(pages: Iterable[Sequence[T]], key: Callable[[T], Any], limit: int) -> list[T]:
    """The first `limit` of several sorted pages, in order."""
    merged = sorted((item for page in pages for item in page), key=key)
    return merged[:limit]


# How the shard router combines what each answering shard said (`down`: the shards that did
# not answer). One cluster's answer is used as it is.


def stats_of(results: Mapping[str, Stats], down: Sequence[str]) -> Stats:
    merged = merge_stats(results.values())
    depths = {name: stats.depth for name, stats in results.items()}
    return dataclasses.replace(merged, shards_down=tuple(down), by_shard=depths)


def probe_of(results: Mapping[str, Probe], down: Sequence[str]) -> Probe:
    return merge_probes(results.values())


def schedules_of(results: Mapping[str, list[Schedule]], down: Sequence[str]) -> list[Schedule]:
    return sorted((s for found in results.values() for s in found), key=lambda s: s.name)


def batches_of(limit: int) -> Callable[[Mapping[str, list[BatchStatus]], Sequence[str]], Any]:
    """Batches in creation order (their ids' hex part, after the shard's name)."""

    def merge(results: Mapping[str, list[BatchStatus]], down: Sequence[str]) -> list[BatchStatus]:
        pages = [
            [dataclasses.replace(b, shard=name) for b in page] for name, page in results.items()
        ]
        return merge_sorted(pages, key=lambda b: b.id.rpartition("/")[2], limit=limit)

    return merge


def groups_of(limit: int) -> Callable[[Mapping[str, list[GroupInfo]], Sequence[str]], Any]:
    def merge(results: Mapping[str, list[GroupInfo]], down: Sequence[str]) -> list[GroupInfo]:
        pages = [
            [dataclasses.replace(i, shard=name) for i in page] for name, page in results.items()
        ]
        return merge_sorted(pages, key=lambda info: info.group_id, limit=limit)

    return merge


def _sum_or_none(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


def tenants_of(limit: int) -> Callable[[Mapping[str, list[TenantInfo]], Sequence[str]], Any]:
    """Each tenant's counts summed over the shards, and its tokens (each shard has its own
    bucket); its weight and limits are set on every shard (the largest weight answered, and
    the limits of the last shard read, stand for it while a shard has not caught up)."""

    def merge(results: Mapping[str, list[TenantInfo]], down: Sequence[str]) -> list[TenantInfo]:
        merged: dict[str, TenantInfo] = {}
        for page in results.values():
            for t in page:
                seen = merged.get(t.name)
                merged[t.name] = (
                    t
                    if seen is None
                    else dataclasses.replace(
                        t,
                        weight=max(seen.weight, t.weight),
                        ready=seen.ready + t.ready,
                        groups=seen.groups + t.groups,
                        in_flight=seen.in_flight + t.in_flight,
                        depth=seen.depth + t.depth,
                        tokens=_sum_or_none(seen.tokens, t.tokens),
                    )
                )
        # Each shard's page is its first `limit` names: past the least of their last names,
        # a shard may have names it did not send; stop there.
        full = [page[-1].name for page in results.values() if len(page) >= limit]
        bound = min(full) if full else None
        names = sorted(n for n in merged if bound is None or n <= bound)
        return [merged[n] for n in names[:limit]]

    return merge


def parse_dead_cursor(after: object, *, sharded: bool) -> tuple[int, str]:
    """A `DeadLetter.cursor` as (seq, shard): the listing's order is (seq, shard) (seqs
    are per shard; one cluster's shard is ""). A sharded queue's cursor names its shard,
    one cluster's does not: each is refused by the other."""
    if not isinstance(after, str) or not _CURSOR.fullmatch(after):
        raise InvalidArgument(
            f"after must be a dead letter's cursor (DeadLetter.cursor), got {show(after)}"
        )
    shard, _, seq = after.rpartition("/")
    if shard:
        check_shard_name(shard)
    if sharded and not shard:
        raise InvalidArgument(
            f"after={after!r}: on a sharded queue a cursor names its shard "
            "(DeadLetter.cursor, 'shard/seq')"
        )
    if shard and not sharded:
        raise InvalidArgument(f"after={after!r}: a sharded queue's cursor; this queue has one")
    return int(seq), shard


_CURSOR = re.compile(r"([a-z0-9][a-z0-9_.:-]{0,62}/)?[0-9]{1,18}")  # < 2**63: an SQLite integer


def dead_letters_of(
    limit: int, after: tuple[int, str] | None = None
) -> Callable[[Mapping[str, list[DeadLetter]], Sequence[str]], Any]:
    """The shards' pages merged in (seq, shard) order, from after the cursor `after`: each
    shard sent its first rows from the cursor's seq on (that seq included: on a shard named
    after the cursor's, it comes after the cursor)."""

    def merge(results: Mapping[str, list[DeadLetter]], down: Sequence[str]) -> list[DeadLetter]:
        letters = [
            dataclasses.replace(d, shard=name) for name, page in results.items() for d in page
        ]
        if after is not None:
            letters = [d for d in letters if (d.seq, d.shard) > after]
        return merge_sorted([letters], key=lambda d: (d.seq, d.shard), limit=limit)

    return merge


class Health:
    """Which shards are down: a shard whose call failed as unavailable is skipped by claims and
    refused at once for publishes until a background probe finds it answering again (probes
    back off as `retry.PROBE`). Pure: the caller gives the time, and `random` (the jitter)."""

    def __init__(self, random: Callable[[], float]) -> None:
        self._random = random
        self._down: dict[str, tuple[float, float, int]] = {}  # name -> (since, retry_at, failures)

    def is_down(self, name: str) -> bool:
        return name in self._down

    def down(self) -> list[str]:
        return sorted(self._down)

    def since(self, name: str) -> float | None:
        entry = self._down.get(name)
        return entry[0] if entry else None

    def failed(self, name: str, now: float) -> None:
        """A call (or a probe) found the shard unavailable: retry after a growing wait."""
        since, _, failures = self._down.get(name, (now, now, 0))
        self._down[name] = (since, now + PROBE.delay(failures + 1, self._random), failures + 1)

    def recovered(self, name: str) -> None:
        self._down.pop(name, None)

    def due(self, now: float) -> list[str]:
        """The down shards whose next probe is due."""
        return sorted(name for name, (_, retry_at, _) in self._down.items() if retry_at <= now)

    def next_retry(self) -> float | None:
        return min((retry_at for _, retry_at, _ in self._down.values()), default=None)


class ShardHealth:
    """Which shards answer, as one client sees them: a shard whose call failed as unavailable
    is `refused` (its groups' calls fail at once with `ShardDown`, claims skip it); one whose
    claim round did not answer in time is `skipped` by claims (publishes still try it). Both
    are probed in the background (`due`) until they answer. Pure: the caller gives the time,
    and `random` (the jitter of the probes)."""

    def __init__(self, names: Sequence[str], random: Callable[[], float]) -> None:
        self.names = list(names)
        self.refused = Health(random)
        self.skipped = Health(random)

    def live(self) -> list[str]:
        return [name for name in self.names if not self.refused.is_down(name)]

    def claimable(self) -> list[str]:
        return [name for name in self.live() if not self.skipped.is_down(name)]

    def down(self) -> list[str]:
        return sorted({*self.refused.down(), *self.skipped.down()})

    def check_up(self, name: str, now: float, leases: bool = False) -> None:
        """`ShardDown` if the shard is refused; with `leases` (calls on leases) also if it is
        skipped by claims: a lease call must not hold its caller for a deadline."""
        since = self.refused.since(name)
        if since is None and leases:
            since = self.skipped.since(name)
        if since is not None:
            raise ShardDown(
                f"shard {name!r} has not answered for {now - since:.1f}s (probed in the "
                "background); its groups are unavailable until it answers"
            )

    def failed(self, name: str, now: float, *, claims: bool = False) -> None:
        (self.skipped if claims else self.refused).failed(name, now)

    def due(self, now: float) -> list[str]:
        return sorted({*self.refused.due(now), *self.skipped.due(now)})

    def probed(self, name: str, now: float, answered: bool) -> None:
        for health in (self.refused, self.skipped):
            if answered:
                health.recovered(name)
            elif health.is_down(name):
                health.failed(name, now)

    def next_probe(self) -> float | None:
        retries = [r for h in (self.refused, self.skipped) if (r := h.next_retry()) is not None]
        return min(retries, default=None)


# ------------------------------------------------------------------ a round over shards


def split_round(
    checked: CheckedRound, shard_of: Callable[[Lease], str]
) -> dict[str, list[Settlement]]:
    """The round's settlements by the shard of their lease, in their order."""
    parts: dict[str, list[Settlement]] = {}
    for s in checked.settlements:
        parts.setdefault(shard_of(s.lease), []).append(s)
    return parts


def route_follow_ups(
    settlements: Sequence[Settlement], name: str, shard_list: ShardList
) -> list[Settlement]:
    """The settlements of shard `name`, their follow-ups split: those of groups that live on
    it are published with the settlement; the others (and, while the shard list changes,
    those of groups that move) are written to its outbox, to be forwarded."""
    routed = []
    for s in settlements:
        if not s.follow_ups:
            routed.append(s)
            continue
        here: list[NewMessage] = []
        there: list[NewMessage] = []
        for m in s.follow_ups:
            target, previous = shard_list.placement(m.group_id)
            (here if target == previous == name else there).append(m)
        routed.append(dataclasses.replace(s, follow_ups=tuple(here), outboxed=tuple(there)))
    return routed


def outbox_message(shard: str, row: OutboxRow) -> NewMessage:
    """A follow-up from shard `shard`'s outbox, as forwarded: with its own dedup id, or one
    made from its row (both scoped to its group), so forwarding it twice publishes it once."""
    if row.message.dedup_id is not None:
        return row.message
    made = scoped_dedup_id(row.message.group_id, f"outbox:{shard}:{row.id}")
    return row.message._replace(dedup_id=made)


def finished_on(
    checked: CheckedRound, shard_of: Callable[[Lease], str], shards: Iterable[str]
) -> list[Lease]:
    """The acked and dead-lettered leases of these shards (those that answered)."""
    answered = set(shards)
    return [
        s.lease for s in checked.settlements if s.kind == FINISH and shard_of(s.lease) in answered
    ]


def merge_rounds(
    checked: CheckedRound, rounds: Mapping[str, Round], unsettled: Sequence[Settlement]
) -> Round:
    """The shards' rounds as one: leases tagged with their shard, the lost in the order given."""

    def tagged(name: str, leases: Iterable[Lease]) -> list[Lease]:
        return [dataclasses.replace(lease, shard=name) for lease in leases]

    return Round(
        leases=[lease for n, r in rounds.items() for lease in tagged(n, r.leases)],
        lost=in_given_order(checked.leases, [r.lost for r in rounds.values()]),
        extended=[lease for n, r in rounds.items() for lease in tagged(n, r.extended)],
        unsettled=[s.lease for s in sorted(unsettled, key=lambda s: s.index)],
    )


def status_of(
    name: str,
    shard_list: ShardList,
    stats: Stats,
    epoch: int,
    leaving: int,
    schedules: Iterable[Schedule],
    waiting: int,
) -> ShardStatus:
    """A shard as a change of the shard list sees it, from what it answered."""
    return ShardStatus(
        name,
        shard_list.state(name),
        True,
        epoch,
        stats.depth,
        stats.groups,
        leaving,
        waiting,
        stats.dead,
        sum(1 for s in schedules if shard_list.shard_of(s.group_id) != name),
    )


def status_unknown(name: str, shard_list: ShardList) -> ShardStatus:
    """A shard that did not answer."""
    none = None
    return ShardStatus(
        name, shard_list.state(name), False, none, none, none, none, none, none, none
    )
