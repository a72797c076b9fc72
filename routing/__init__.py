"""Pure-Python AMQP 0-9-1 routing: exchange types as modules behind one interface
(``types.ExchangeType``), one registry of type names (``registry``), and ``route()``.

Destinations are opaque hashable tuples, ``("q", queue)`` or ``("e", exchange)``.
"""
from __future__ import annotations

from .base import BindingTable, args_key
from .consistent_hash import X_CONSISTENT_HASH, ConsistentHashIndex, RoutingFields
from .default import DefaultIndex
from .direct import DirectIndex
from .fanout import FanoutIndex
from .headers import HeadersIndex
from .registry import STANDARD, TYPES, exchange_type, make_index
from .route import route
from .super_stream import X_SUPER_STREAM, SuperStreamIndex, partition_of
from .topic import TopicIndex
from .types import ExchangeType, InvalidExchangeArguments, UnknownExchangeType

__all__ = [
    "BindingTable",
    "ConsistentHashIndex",
    "DefaultIndex",
    "DirectIndex",
    "ExchangeType",
    "FanoutIndex",
    "HeadersIndex",
    "InvalidExchangeArguments",
    "RoutingFields",
    "STANDARD",
    "SuperStreamIndex",
    "TYPES",
    "TopicIndex",
    "UnknownExchangeType",
    "X_CONSISTENT_HASH",
    "X_SUPER_STREAM",
    "args_key",
    "exchange_type",
    "make_index",
    "partition_of",
    "route",
]
