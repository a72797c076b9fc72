"""Follow exchange-to-exchange bindings and alternate exchanges to queue names."""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence


def _match(exchange: Any, routing_key: str | tuple, headers: dict | None) -> Sequence:
    """The exchange's matches for one routing key, or for any of a tuple of them (a message with
    CC/BCC keys: RabbitMQ matches all of them at every exchange it passes), each once."""
    if type(routing_key) is not tuple:
        return exchange.index.match(routing_key, headers)
    dests: dict = {}
    for key in routing_key:
        for dest in exchange.index.match(key, headers):
            dests.setdefault(dest, None)
    return tuple(dests)


def _targets(exchange: Any, routing_key: str | tuple, headers: dict | None) -> Sequence:
    """The exchange's matches, or its alternate exchange when nothing matched."""
    dests = _match(exchange, routing_key, headers)
    if dests:
        return dests
    ae = exchange.alternate_exchange
    return (("e", ae),) if ae else ()


def route(
    lookup: Callable[[str], Any],
    exchange_name: str,
    routing_key: str | tuple,
    headers: dict | None,
) -> list[str]:
    """Queue names reached from ``exchange_name``, each once, in first-reached order.

    ``lookup(name)`` gives None or an object with ``.index`` and
    ``.alternate_exchange``. Exchanges are walked depth-first; each exchange
    is visited at most once, so cycles terminate; unknown exchanges are skipped.
    """
    exchange = lookup(exchange_name)
    if exchange is None:
        return []
    first = _match(exchange, routing_key, headers)
    if first:
        names = []
        for kind, name in first:
            if kind != "q":
                break
            names.append(name)
        else:
            return names  # fast path: only queues, each already unique
    elif not exchange.alternate_exchange:
        return []
    else:
        first = (("e", exchange.alternate_exchange),)

    queues: dict[str, None] = {}
    seen = {exchange_name}
    stack: list[Iterator] = [iter(first)]
    while stack:
        for kind, name in stack[-1]:
            if kind == "q":
                queues[name] = None
            elif kind == "e" and name not in seen:
                seen.add(name)
                nxt = lookup(name)
                if nxt is not None:
                    stack.append(iter(_targets(nxt, routing_key, headers)))
                    break
        else:
            stack.pop()
    return list(queues)
