"""Deliveries kept as columns: what the connection buffers and the readers turn into Arrow.

The connection appends every delivery to one flat list, ``STRIDE`` entries per delivery::

    delivery tag, redelivered, (exchange, routing key), consumer tag, properties, body, offset

* ``properties`` is ``None`` when the message has no properties other than (possibly) the
  ``x-stream-offset`` header a stream queue adds; otherwise a decoded ``Properties``;
* ``offset`` is the ``x-stream-offset`` header (a long) or ``None``;
* the (exchange, routing key) tuple and the consumer tag are shared between deliveries.

A flat list of strings, bytes and integers is cheap to grow (no tuple per delivery for the
garbage collector to scan) and a column is one slice of it (``flat[5::STRIDE]``: the bodies).
``Delivery`` tuples are built only for the callers that want rows (``rows()``).
"""

from __future__ import annotations

from typing import Iterable

from .codec import EMPTY_PROPERTIES, Delivery, Properties

__all__ = ["STRIDE", "DeliveryBatch", "offset_properties", "stream_offset_of"]

STRIDE = 7
_NO_MORE = (None,) * 11                # the properties after ``headers``


def offset_properties(offset: int | None) -> Properties:
    """The properties of a message whose only property is the ``x-stream-offset`` header
    (``offset``), or none at all (``offset`` None)."""
    if offset is None:
        return EMPTY_PROPERTIES
    return Properties(None, None, {"x-stream-offset": offset}, *_NO_MORE)


def stream_offset_of(props: Properties) -> int | None:
    """The ``x-stream-offset`` header (a long) of a delivery's properties, else None."""
    headers = props[2]
    if not headers:
        return None
    value = headers.get("x-stream-offset")
    return value if type(value) is int else None


class DeliveryBatch:
    """Deliveries in arrival order, as columns (see the module docstring)."""

    __slots__ = ("flat",)

    def __init__(self, flat: list | None = None) -> None:
        self.flat = flat if flat is not None else []

    @classmethod
    def from_rows(cls, deliveries: Iterable[Delivery]) -> "DeliveryBatch":
        flat: list = []
        for d in deliveries:
            p = d.properties
            off = stream_offset_of(p)
            if p == EMPTY_PROPERTIES or (off is not None and p == offset_properties(off)):
                p = None
            flat.extend((d.delivery_tag, d.redelivered, (d.exchange, d.routing_key),
                         d.consumer_tag, p, d.body, off))
        return cls(flat)

    def __len__(self) -> int:
        return len(self.flat) // STRIDE

    def __bool__(self) -> bool:
        return bool(self.flat)

    # -- columns --------------------------------------------------------------------------
    @property
    def tags(self) -> list[int]:
        return self.flat[0::STRIDE]

    @property
    def redelivered(self) -> list[bool]:
        return self.flat[1::STRIDE]

    @property
    def names(self) -> list[tuple[str, str]]:
        """(exchange, routing key) per delivery."""
        return self.flat[2::STRIDE]

    @property
    def consumer_tags(self) -> list[str]:
        return self.flat[3::STRIDE]

    @property
    def raw_properties(self) -> list[Properties | None]:
        """Decoded properties, or None where they are only (at most) the offset header."""
        return self.flat[4::STRIDE]

    @property
    def bodies(self) -> list[bytes]:
        return self.flat[5::STRIDE]

    @property
    def offsets(self) -> list[int | None]:
        return self.flat[6::STRIDE]

    @property
    def last_tag(self) -> int:
        return self.flat[-STRIDE]

    def properties(self) -> list[Properties]:
        """Every delivery's ``Properties`` (built where they were left as None)."""
        return [offset_properties(o) if p is None else p
                for p, o in zip(self.flat[4::STRIDE], self.flat[6::STRIDE])]

    # -- slicing ---------------------------------------------------------------------------
    def slice(self, start: int, stop: int | None = None) -> "DeliveryBatch":
        return DeliveryBatch(self.flat[start * STRIDE:None if stop is None else stop * STRIDE])

    def extend(self, other: "DeliveryBatch") -> None:
        self.flat.extend(other.flat)

    def rows(self) -> list[Delivery]:
        """The deliveries as ``Delivery`` tuples."""
        f = self.flat
        new = tuple.__new__
        return [new(Delivery, (tag, redelivered, names[0], names[1],
                               offset_properties(offset) if props is None else props, body, ctag))
                for tag, redelivered, names, ctag, props, body, offset
                in zip(*(f[i::STRIDE] for i in range(STRIDE)))]
