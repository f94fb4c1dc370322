"""The queue's configuration, without I/O: what every family's plan function
(`publish.plan`, `rounds.plan`, `admin.stats`, ...) is given.

Deterministic, like h11: the clock, the lease tokens and the coin that decides when to prune
are given to it (`QueueCore(clock=..., token=..., chance=...)`); nothing in the protocol
reads the time, draws a random number or touches a socket, so every plan can be tested on
canned results."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ..codec import Codec, as_codec
from ..errors import (
    ClockSkew,
    DecodeError,
    EncodeError,
    InvalidArgument,
    PayloadTooLarge,
    QueueError,
    TransportClosed,
)
from .batch_ids import BatchIds
from .checks import check_int, check_seconds, show
from .names import Names
from .outcomes import check_keep

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_DEDUP_WINDOW = 300.0
DEFAULT_MAX_SKEW = 0.25
"""A lease (claim or extend) is refused when this client's clock is proven to be further
than this fraction of the lease's visibility from the cluster's (None: never; for a clock of
the caller's own, such as a test's fake clock)."""
QUEUE_NAME = re.compile(r"[a-z0-9_]{1,40}")


class QueueCore:
    """A queue's configuration, the one value every plan function of the protocol takes: its
    names (`Names`: its statements are rendered for them), its codec, its clock, its source
    of lease tokens and the coin that decides when to prune, its limits; and whether it is
    closed (a plan of a closed queue is refused: `now`)."""

    def __init__(
        self,
        *,
        queue: str = "default",
        codec: Codec | type[Any] | None = None,
        clock: Callable[[], float],
        token: Callable[[], str],
        chance: Callable[[], float],
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
        dedup_key: Callable[[Any], str | None] | None = None,
        max_skew: float | None = DEFAULT_MAX_SKEW,
        keep: float | None = None,
    ) -> None:
        if not isinstance(queue, str) or not QUEUE_NAME.fullmatch(queue):
            raise InvalidArgument(
                f"queue name {queue!r}: use 1-40 lower-case letters, digits or '_'"
            )
        check_seconds(dedup_window, "dedup_window", allow_zero=False)
        check_int(max_payload_bytes, "max_payload_bytes", 1)
        if dedup_key is not None and not callable(dedup_key):
            raise InvalidArgument(
                f"dedup_key must be a function of the event, got {show(dedup_key)}"
            )
        try:
            self.codec = as_codec(codec)
        except TypeError as exc:
            raise InvalidArgument(str(exc)) from None
        if max_skew is not None and (
            isinstance(max_skew, bool)
            or not isinstance(max_skew, int | float)
            or not 0 <= max_skew <= 1
        ):
            raise InvalidArgument(
                f"max_skew must be a fraction of visibility in [0, 1], or None; got "
                f"{show(max_skew)}"
            )
        self.names = Names.of(queue)
        self.clock = clock
        self.token = token
        self.chance = chance
        self.max_payload_bytes = max_payload_bytes
        self.dedup_window = float(dedup_window)
        self.dedup_key = dedup_key
        self.max_skew = max_skew
        self.keep = check_keep(keep)
        """How long the outcome of a message published without `keep=` is kept (None: not
        kept)."""
        self.closed = False
        self.batch_ids = BatchIds()
        self.trace_headers: Callable[[], Mapping[str, str] | None] | None = None
        """What every message checked now carries besides its own headers: the trace context
        in force (OpenTelemetry's, set by the transport when it is installed; None: nothing)."""

    def now(self) -> float:
        """The time a plan is made at (`TransportClosed` once the queue is closed)."""
        if self.closed:
            raise TransportClosed(f"queue {self.names.queue!r}: the transport is closed")
        return self.clock()

    def check_open(self) -> None:
        self.now()

    def check_skew(self, skew: float, visibility: float) -> None:
        """`ClockSkew` if a cluster whose clock is `skew` seconds from this client's (signed:
        theirs minus ours) would see a lease of `visibility` lapse too early or too late."""
        if self.max_skew is None or abs(skew) <= self.max_skew * visibility:
            return
        raise ClockSkew(
            f"this client's clock is {abs(skew):.1f} s {'behind' if skew > 0 else 'ahead of'} "
            f"the rqlite node's: a {visibility:g} s lease would look "
            f"{'lapsed early' if skew > 0 else 'held too long'} to other clients; refusing "
            f"to lease (the limit is {self.max_skew:g} of the visibility, max_skew). "
            f"Keep clocks in sync (NTP)"
        )

    def dedup_id(self, event: Any) -> str | None:
        if self.dedup_key is None:
            return None
        try:
            return self.dedup_key(event)
        except Exception as exc:
            raise InvalidArgument(f"dedup_key failed on this event: {exc!r}") from exc

    def encode(self, event: Any) -> str:
        try:
            text = self.codec.encode(event)
        except QueueError:
            raise
        except Exception as exc:  # a codec's own bug, or json's RecursionError
            raise EncodeError(f"the codec could not encode this payload: {show(exc)}") from exc
        if not isinstance(text, str):
            raise EncodeError(f"the codec must encode to str, got {type(text).__name__}")
        if "\x00" in text:
            raise EncodeError("the encoded payload holds a NUL, which SQLite cuts text at")
        if text.isascii():  # (the common case: its size is its length, nothing to check)
            size = len(text)
        else:
            try:
                size = len(text.encode("utf-8"))
            except UnicodeEncodeError as exc:
                raise EncodeError(f"payload is not valid Unicode text: {exc.reason}") from None
        if size > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload is {size} bytes encoded; the limit is {self.max_payload_bytes}"
            )
        return text

    def decode(self, text: str) -> Any:
        try:
            return self.codec.decode(text)
        except QueueError:
            raise
        except Exception as exc:  # a codec's own bug
            raise DecodeError(f"the codec could not decode a stored payload: {show(exc)}") from exc
