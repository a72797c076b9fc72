"""Exchange type ``x-local-random`` (RabbitMQ 4.0 core, rabbit_exchange_type_local_random).

Meant for request-reply with exclusive queues: each message goes to ONE bound queue, picked at
random among the queues local to this node (a queue another node leads is never picked; none
local: the message is unroutable). As RabbitMQ: the binding key must be empty ("Non empty binding
'k' key not permitted"), the destination must be a classic queue (an exchange: "Destination not
found"; another queue type: "Queue type ... not valid for this exchange type"), all 406.

The core attaches the vhost's queue table (``attach``) so the index can see each queue's type and
whether it is local (``remote`` set on a cluster placeholder); without it every queue counts as a
local classic queue.
"""
from __future__ import annotations

import random
from typing import Mapping

from .base import BindingKey, BindingTable, Dest
from .types import ExchangeType

X_LOCAL_RANDOM = "x-local-random"


class LocalRandomIndex(BindingTable):
    def __init__(self, rng: random.Random | None = None) -> None:
        super().__init__()
        self._queues: Mapping | None = None
        self._dests: list[Dest] | None = None
        self._rng = rng or random.Random()

    def attach(self, queues: Mapping) -> None:
        """The vhost's queue table (name -> queue object)."""
        self._queues = queues

    def bind(self, dest: Dest, routing_key: str, arguments: dict | None = None) -> bool:
        if routing_key:
            raise ValueError(f"Non empty binding '{routing_key}' key not permitted")
        if dest[0] != "q":
            raise ValueError("Destination not found")
        q = self._queues.get(dest[1]) if self._queues is not None else None
        kind = getattr(q, "queue_type", "classic")
        if kind != "classic":
            raise ValueError(f"Queue type {kind} not valid for this exchange type")
        return super().bind(dest, routing_key, arguments)

    def _added(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        self._dests = None

    _removed = _added

    def match(self, routing_key: str, headers: dict | None = None) -> list[Dest]:
        dests = self._dests
        if dests is None:
            dests = self._dests = list(self._by_dest)
        queues = self._queues
        if queues is not None:
            dests = [d for d in dests if not getattr(queues.get(d[1]), "remote", False)]
        if not dests:
            return []
        return [dests[0]] if len(dests) == 1 else [self._rng.choice(dests)]


class LocalRandomType(ExchangeType):
    name = X_LOCAL_RANDOM
    index_class = LocalRandomIndex
