"""A web dashboard for one queue (the `dashboard` extra): `create_app(transport)` is an ASGI
app; `rqlite-queue dashboard` serves it."""

from .app import create_app

__all__ = ["create_app"]
