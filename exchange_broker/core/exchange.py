"""Exchanges: a type (from routing's registry), flags, arguments and a binding index."""

from __future__ import annotations

import routing

from exchange_broker.protocol.constants import COMMAND_INVALID, PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError


def make_index(type: str, arguments: dict | None):
    """The binding index of a new exchange (503 for an unknown type, 406 for arguments the type
    refuses, as RabbitMQ answers exchange.declare)."""
    try:
        return routing.make_index(type, arguments)
    except routing.UnknownExchangeType as exc:
        raise AMQPError(COMMAND_INVALID, str(exc), 40, 10, hard=True) from None
    except routing.InvalidExchangeArguments as exc:
        raise AMQPError(PRECONDITION_FAILED, str(exc), 40, 10, hard=False) from None

class Exchange:
    __slots__ = ("vhost", "name", "type", "durable", "auto_delete", "internal", "arguments", "index",
                 "alternate_exchange", "stats_in", "stats_out", "holds_messages")

    def __init__(self, vhost: str, name: str, type: str, durable: bool = False,
                 auto_delete: bool = False, internal: bool = False, arguments: dict | None = None,
                 index=None) -> None:
        self.vhost = vhost
        self.name = name
        self.type = type
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.index = index if index is not None else routing.make_index(type, self.arguments)
        kind = routing.TYPES.get(type)
        self.holds_messages = kind is not None and kind.holds_messages  # x-delayed-message
        ae = self.arguments.get("alternate-exchange")
        if isinstance(ae, bytes):
            ae = ae.decode("utf-8", "replace")
        self.alternate_exchange = ae if isinstance(ae, str) and ae else None
        self.stats_in = 0
        self.stats_out = 0

    @property
    def is_default(self) -> bool:
        return self.name == ""

    @property
    def builtin(self) -> bool:
        return self.name == "" or self.name.startswith("amq.")
