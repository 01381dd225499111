"""Chronicle Wire for Python: the BINARY wire (byte-compatible with Java), text renderings and MessageHistory."""

from wire.errors import WireError

__all__ = ["WireError"]
