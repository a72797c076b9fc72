"""Methods that name queues and exchanges as RabbitMQ allows: any UTF-8 up to 255 bytes.

pamqp checks queue and exchange names against the spec's old pattern (``[a-zA-Z0-9-_.:@#,/+ ]``)
when a method is made and again when it is encoded, so a client built on it cannot declare,
consume from or bind ``orders>eu`` or ``files(é)``, names RabbitMQ and this broker take.
:func:`method` makes the same pamqp method without that check (only the length of each short
string is checked); :func:`~exchange_broker.protocol.codec.method_frame` encodes it as any other.
"""

from __future__ import annotations

from functools import lru_cache

from pamqp import base


@lru_cache(maxsize=None)
def _lenient(cls: type[base.Frame]) -> type[base.Frame]:
    def validate(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name, None)
            if cls.amqp_type(name) == "shortstr" and isinstance(value, str) and len(value.encode()) > 255:
                raise ValueError(f"{name} is longer than 255 bytes")

    return type(cls.__name__, (cls,), {"validate": validate, "__module__": __name__,
                                       "__qualname__": cls.__qualname__})


def method(cls: type[base.Frame], **fields) -> base.Frame:
    """``cls(**fields)`` (a pamqp method class) with any UTF-8 queue and exchange names."""
    return _lenient(cls)(**fields)
