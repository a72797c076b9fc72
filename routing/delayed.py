"""Exchange type ``x-delayed-message`` (RabbitMQ's delayed-message plugin): bindings and routing
are those of the type named by the ``x-delayed-type`` argument; messages carrying a valid
``x-delay`` header are held until due (``holds_messages``: the core's delayed-message manager,
``exchange_broker/core/delayed.py``, keeps them and routes them through this exchange later).
"""
from __future__ import annotations

from .base import BindingTable
from .types import ExchangeType, InvalidExchangeArguments, UnknownExchangeType

X_DELAYED = "x-delayed-message"
INVALID_TYPE = "Invalid argument, 'x-delayed-type' must be an existing exchange type"


class DelayedMessageType(ExchangeType):
    name = X_DELAYED
    holds_messages = True
    in_leaders_cluster = True  # in a cluster one node holds and fires them (cluster/delayed_leader.py)

    def make_index(self, arguments: dict | None, registry: dict[str, ExchangeType]) -> BindingTable:
        kind = (arguments or {}).get("x-delayed-type")
        if isinstance(kind, (bytes, bytearray)):
            kind = bytes(kind).decode("utf-8", "replace")
        if not isinstance(kind, str) or kind == X_DELAYED:
            raise InvalidExchangeArguments(INVALID_TYPE)
        base = registry.get(kind)
        if base is None:
            raise UnknownExchangeType(kind)
        return base.make_index(arguments, registry)
