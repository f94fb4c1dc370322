"""One settlement (the single calls', and a Worker round's with one): the statements of
`settlements` with the lease as plain parameters (:g, :t, :q) instead of a JSON array walked
by `json_each`. The same effects; SQLite compiles them in about half the time, and rqlite
compiles every statement on every node for every request."""

from __future__ import annotations

from ..group_states import LEASED
from .names import Names, Sql
from .plan import Builder
from .schema import RETIRE_WINDOW
from .settlements import COUNT_EXPIRED, FREED, Settle, giving_back, parked_after

_HOLDS_ONE = Sql("EXISTS (SELECT 1 FROM {groups} WHERE group_id = :g AND token = :t AND head = :q)")
# The record of the settlement if it holds (or if an earlier send applied it: it counts, so
# that the settlement reads its outcome from this statement).
_RECORDED_ONE_TEXT = """
    INSERT INTO {settled} (token, seq, kind, expires_at{columns}) SELECT :t, :q, :kind, :e{values}
    WHERE {holds} OR EXISTS (
      SELECT 1 FROM {settled} WHERE token = :t AND seq = :q AND kind = :kind
      AND expires_at >= :now)
    ON CONFLICT (token, seq) DO UPDATE SET expires_at = excluded.expires_at
    """
_RECORDED_ONE = Sql(_RECORDED_ONE_TEXT, holds=_HOLDS_ONE, columns="", values="")
_RECORDED_ONE_KEPT = Sql(
    _RECORDED_ONE_TEXT, holds=_HOLDS_ONE, columns=", result, error", values=", :res, :err"
)
_DEAD_ONE = Sql(
    """
    INSERT INTO {dead} (seq, group_id, event, priority, attempts, reason, published_at,
      dead_at, headers, keep)
    SELECT m.seq, m.group_id, m.event, g.priority, g.attempts, :reason, m.published_at, :now,
      m.headers, m.keep
    FROM {groups} g JOIN {messages} m ON m.seq = g.head
    WHERE g.group_id = :g AND g.token = :t AND g.head = :q AND m.cancel IS NULL
    """
)
_DONE_ONE = Sql("DELETE FROM {messages} WHERE seq = :q AND {holds}", holds=_HOLDS_ONE)


_FINISHED_ONE = Sql(
    """
    UPDATE {groups} SET {freed}, held = max(held, :h) FROM (
      SELECT (SELECT due FROM {messages} WHERE group_id = :g ORDER BY seq LIMIT 1) d)
    WHERE group_id = :g AND token = :t AND head = :q
    """,
    freed=FREED,
)


_CHANGED_ONE = Sql(
    """
    UPDATE {groups} SET ready = iif(:u <= 0, {READY.ready}, {LEASED.ready}), until = :u,
      parked = :p, token = CASE WHEN :keep THEN token END
    WHERE group_id = :g AND token = :t AND head = :q
    """
)


def settle_one(b: Builder, n: Names, s: Settle, now: float) -> None:
    (held,) = s.all()
    (kind,) = s.kinds()
    lease = {"g": held.group_id, "t": held.token, "q": held.seq}
    if kind:
        params = {**lease, "kind": kind, "e": now + RETIRE_WINDOW, "now": now}
        kept = s.kept.get(held.seq)
        if kept is None:
            b.add(_RECORDED_ONE(n), params, slot="recorded")
        else:
            params["res"], params["err"] = kept
            b.add(_RECORDED_ONE_KEPT(n), params, slot="recorded")
    if s.finish:
        if s.dead:
            b.add(_DEAD_ONE(n), {**lease, "reason": s.dead[held.seq], "now": now})
        b.add(_DONE_ONE(n), lease)
        params = {**lease, "h": int(held.seq in s.hold), "retire": now + RETIRE_WINDOW, "now": now}
        b.add(_FINISHED_ONE(n), params, slot="finished")
    if s.expired:
        b.add(COUNT_EXPIRED(n), {"k": s.expired})
    giving_back(b, n, s, now)
    if s.give_back or s.extend:
        if s.give_back:
            until, parked, keep = s.give_back[0][1], parked_after(s.give_back[0][1]), 0
        else:
            until, parked, keep = s.extend_until, LEASED.parked, 1
        b.add(_CHANGED_ONE(n), {**lease, "u": until, "p": parked, "keep": keep}, slot="changed")
