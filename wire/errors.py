"""The one exception the wire layer raises for bad input."""

from __future__ import annotations

__all__ = ["WireError"]


class WireError(ValueError):
    """Bytes or text that are not a valid wire document; `offset` is where decoding stopped."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message if offset is None else f"{message} (at offset {offset})")
        self.offset = offset
