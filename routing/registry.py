"""The one registry of exchange type names."""
from __future__ import annotations

from .base import BindingTable
from .consistent_hash import ConsistentHashType
from .delayed import DelayedMessageType
from .direct import DirectType
from .fanout import FanoutType
from .headers import HeadersType
from .local_random import LocalRandomType
from .modulus_hash import ModulusHashType
from .super_stream import SuperStreamType
from .topic import TopicType
from .types import ExchangeType, UnknownExchangeType

TYPES: dict[str, ExchangeType] = {t.name: t for t in (
    DirectType(), FanoutType(), TopicType(), HeadersType(), DelayedMessageType(),
    SuperStreamType(),
    ConsistentHashType(), ModulusHashType(), LocalRandomType())}

# the plain AMQP 0-9-1 types (what x-delayed-type may name, what the admin API lists first)
STANDARD = ("direct", "fanout", "topic", "headers")


def exchange_type(name: str) -> ExchangeType:
    """The type registered under ``name``; UnknownExchangeType otherwise."""
    found = TYPES.get(name)
    if found is None:
        raise UnknownExchangeType(name)
    return found


def make_index(name: str, arguments: dict | None = None) -> BindingTable:
    """A fresh binding index for an exchange of type ``name`` declared with ``arguments``."""
    return exchange_type(name).make_index(arguments or {}, TYPES)
