"""Who may see the dashboard, and which requests may change the queue.

- Optional access control for the whole dashboard: HTTP Basic (a browser asks for it) or a
  bearer token (scripts); both compared in constant time.
- State-changing requests are POSTs that carry the CSRF token of this dashboard process: a
  random value that only its own pages hold (another site's page cannot read them), compared
  in constant time. A dashboard started read-only refuses every POST, token or not."""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from dataclasses import dataclass, field

from ..errors import InvalidArgument


@dataclass(frozen=True)
class Access:
    basic: tuple[str, str] | None = field(default=None, repr=False)
    bearer: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.basic is not None and not (
            isinstance(self.basic, tuple)
            and len(self.basic) == 2
            and all(isinstance(part, str) and part for part in self.basic)
            and ":" not in self.basic[0]
        ):
            raise InvalidArgument("basic auth must be a (user, password) pair of non-empty strings")
        if self.bearer is not None and (not isinstance(self.bearer, str) or not self.bearer):
            raise InvalidArgument("the bearer token must be a non-empty string")

    @property
    def required(self) -> bool:
        return self.basic is not None or self.bearer is not None

    def allows(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value grants access."""
        if not self.required:
            return True
        if not authorization:
            return False
        scheme, _, value = authorization.partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and self.bearer is not None:
            return hmac.compare_digest(value.encode(), self.bearer.encode())
        if scheme.lower() == "basic" and self.basic is not None:
            try:
                decoded = base64.b64decode(value, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return False
            user, _, password = decoded.partition(":")
            return hmac.compare_digest(user.encode(), self.basic[0].encode()) & hmac.compare_digest(
                password.encode(), self.basic[1].encode()
            )
        return False


class Csrf:
    def __init__(self) -> None:
        self.token = secrets.token_urlsafe(32)

    def valid(self, submitted: object) -> bool:
        return isinstance(submitted, str) and hmac.compare_digest(
            submitted.encode(), self.token.encode()
        )
