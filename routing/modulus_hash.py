"""Exchange type ``x-modulus-hash`` (RabbitMQ 4.3 core, rabbit_exchange_type_modulus_hash).

Binding keys are ignored. Each message goes to exactly one bound destination: the destinations are
sorted (exchanges before queues, then by name, as RabbitMQ sorts its resource records, so routing
is stable across restarts), and the message goes to ``hash(routing key) mod count``. RabbitMQ hashes
with Erlang's phash2; this hashes with murmur3 (stable, uniform, but a key may pick another
destination than RabbitMQ's).
"""
from __future__ import annotations

import mmh3

from .base import BindingKey, BindingTable, Dest
from .types import ExchangeType

X_MODULUS_HASH = "x-modulus-hash"


class ModulusHashIndex(BindingTable):
    def __init__(self) -> None:
        super().__init__()
        self._sorted: list[Dest] | None = None

    def _added(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        self._sorted = None

    _removed = _added

    def destinations(self) -> list[Dest]:
        """The bound destinations, each once, in routing order."""
        if self._sorted is None:
            self._sorted = sorted(set(self._by_dest), key=lambda d: (str(d[0]), str(d[1])))
        return self._sorted

    def match(self, routing_key: str, headers: dict | None = None) -> list[Dest]:
        dests = self.destinations()
        if not dests:
            return []
        h = mmh3.hash(routing_key.encode("utf-8", "surrogatepass"), signed=False)
        return [dests[h % len(dests)]]


class ModulusHashType(ExchangeType):
    name = X_MODULUS_HASH
    index_class = ModulusHashIndex
