"""MQTT's field types on the wire: a bounds-checked reader and the writers (sans-IO)."""

from __future__ import annotations

import struct

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


class MalformedPacket(Exception):
    """Input that is not MQTT: the connection is closed (5.0: reason 0x81 or ``code``)."""

    def __init__(self, text: str, code: int = 0x81) -> None:
        super().__init__(text)
        self.code = code


class Reader:
    __slots__ = ("data", "pos", "end")

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def left(self) -> int:
        return self.end - self.pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise MalformedPacket("packet shorter than its fields")
        out = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return out

    def byte(self) -> int:
        if self.pos >= self.end:
            raise MalformedPacket("packet shorter than its fields")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def u16(self) -> int:
        return _U16.unpack(self.take(2))[0]

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def varint(self) -> int:
        value, shift = 0, 0
        for _ in range(4):
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise MalformedPacket("variable byte integer longer than 4 bytes")

    def binary(self) -> bytes:
        return self.take(self.u16())

    def string(self) -> str:
        raw = self.binary()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedPacket("string is not UTF-8") from None
        if "\x00" in text:  # MQTT-1.5.4-2: no null character
            raise MalformedPacket("string holds U+0000")
        return text


def varint(n: int) -> bytes:
    if not 0 <= n <= 268_435_455:
        raise ValueError(f"{n} does not fit a variable byte integer")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def u16(n: int) -> bytes:
    return _U16.pack(n)


def u32(n: int) -> bytes:
    return _U32.pack(n)


def binary(b: bytes) -> bytes:
    return _U16.pack(len(b)) + b


def string(s: str) -> bytes:
    return binary(s.encode("utf-8"))
