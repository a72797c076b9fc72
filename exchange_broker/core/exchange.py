"""Exchanges: a type, flags, arguments and a binding index from routing/."""

from __future__ import annotations

import routing

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")


class Exchange:
    __slots__ = ("vhost", "name", "type", "durable", "auto_delete", "internal", "arguments", "index",
                 "alternate_exchange", "stats_in", "stats_out")

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
        self.index = index if index is not None else routing.make_index(type)
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
