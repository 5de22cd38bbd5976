"""Server WebSocket frames written by the hub itself (:mod:`.wsprotocol`).

A server's frames are not masked (RFC 6455 5.1), so a text frame is a header of two to ten
bytes and the UTF-8 payload: built here in one concatenation rather than through
``websockets``' ``Frame`` objects and its protocol's output list.
"""

from __future__ import annotations

import struct

__all__ = ["text_frame"]


def text_frame(payload: bytes) -> bytes:
    """A final, unmasked text frame of ``payload``: what a server sends (RFC 6455 5.2)."""
    size = len(payload)
    if size < 126:
        return bytes((0x81, size)) + payload
    if size < 1 << 16:
        return struct.pack("!BBH", 0x81, 126, size) + payload
    return struct.pack("!BBQ", 0x81, 127, size) + payload
