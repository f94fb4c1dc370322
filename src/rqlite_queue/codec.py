"""Payload codecs: how a message becomes the text stored in the queue, and back.

Payloads are stored as TEXT so that the same SQL serves SQLite and rqlite's JSON API (which
would hand BLOBs back base64-encoded)."""

from __future__ import annotations

import base64
import json
from typing import Any, Protocol, runtime_checkable

from .errors import DecodeError, EncodeError


@runtime_checkable
class Codec(Protocol):
    def encode(self, payload: Any) -> str: ...

    def decode(self, text: str) -> Any: ...


_ENCODER = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
)
_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)  # (not in the stubs)
_C_ENCODER: Any = (
    None
    if _make_encoder is None
    else _make_encoder(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
)
"""Made once: `json.dumps` with options makes an encoder per call, and even a kept
`JSONEncoder` makes its C encoder per call. (Without the circular check: a payload that holds
itself fails on the recursion limit instead, an `EncodeError` all the same.)"""


_JSON_TYPES = frozenset({dict, list, str, int, float, bool, type(None)})
"""Payloads that are surely not models (a failed `hasattr` costs an exception)."""


class JsonCodec:
    """The default: JSON values (dicts, lists, strings, numbers, booleans, None). A
    pydantic-style model is refused: it would come back as a dict; give the transport
    `codec=Model` (a `ModelCodec`) to get models back."""

    def encode(self, payload: Any) -> str:
        if type(payload) not in _JSON_TYPES and (
            hasattr(payload, "model_dump_json") and not isinstance(payload, type)
        ):
            raise EncodeError(
                f"a {type(payload).__name__} model would come back as a dict: "
                f"open the transport with codec={type(payload).__name__}"
            )
        try:
            if _C_ENCODER is not None:
                return "".join(_C_ENCODER(payload, 0))
            return _ENCODER.encode(payload)
        except (TypeError, ValueError) as exc:
            raise EncodeError(f"payload is not JSON-serialisable: {exc}") from exc

    def decode(self, text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError as exc:
            raise DecodeError(f"stored payload is not JSON: {exc}") from exc


class ModelCodec:
    """Pydantic-style models (`model_dump_json` / `model_validate_json`) of one class."""

    def __init__(self, model: type[Any]) -> None:
        if not (hasattr(model, "model_validate_json") and hasattr(model, "model_dump_json")):
            raise TypeError(f"{model!r} has no model_validate_json/model_dump_json")
        self.model = model

    def encode(self, payload: Any) -> str:
        if not isinstance(payload, self.model):
            raise EncodeError(f"expected a {self.model.__name__}, got {type(payload).__name__}")
        return str(payload.model_dump_json())

    def decode(self, text: str) -> Any:
        try:
            return self.model.model_validate_json(text)
        except ValueError as exc:
            raise DecodeError(f"stored payload is not a valid {self.model.__name__}") from exc


class RawCodec:
    """`str` and `bytes` stored as they are; each comes back as the type it went in as."""

    def encode(self, payload: Any) -> str:
        if isinstance(payload, str):
            return "s" + payload
        if isinstance(payload, bytes | bytearray | memoryview):
            return "b" + base64.b64encode(bytes(payload)).decode("ascii")
        raise EncodeError(f"RawCodec takes str or bytes, got {type(payload).__name__}")

    def decode(self, text: str) -> Any:
        tag, body = text[:1], text[1:]
        if tag == "s":
            return body
        if tag == "b":
            return base64.b64decode(body)
        raise DecodeError("stored payload was not written by RawCodec")


def as_codec(codec: Codec | type[Any] | None) -> Codec:
    """`None` is JSON; a model class is a `ModelCodec`; a codec is itself."""
    if codec is None:
        return JsonCodec()
    if isinstance(codec, type):
        return ModelCodec(codec)
    if isinstance(codec, Codec):
        return codec
    raise TypeError(f"not a codec: {codec!r}")
