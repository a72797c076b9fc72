"""Which node of a cluster runs each mover: rendezvous hashing of the mover's key over the live
nodes, so every node reaches the same answer from the same membership, and when a node dies only
its movers move (each to the live node that ranks highest for it).

With per-queue leaders (``--cluster-mode leaders``) every node shares the store: each one follows
the stored parameters (:func:`follow`) and runs the movers placed on it. Until a node knows the
live nodes (its first heartbeat) it runs none: two nodes never both run one by guessing."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Callable, Iterable

log = logging.getLogger("exchange_broker.movers")

FOLLOW_INTERVAL = 2.0  # seconds between reads of the stored parameters and of the live nodes


class Placement:
    def __init__(self, me: str, members: Callable[[], Iterable[str]]) -> None:
        self.me = me
        self.members = members

    def owner(self, key: tuple) -> str | None:
        nodes = set(self.members())
        if not nodes:
            return None
        nodes.add(self.me)
        label = "\0".join(key).encode()
        return max(sorted(nodes), key=lambda n: hashlib.sha256(label + b"\0" + n.encode()).digest())

    def mine(self, key: tuple) -> bool:
        return self.owner(key) == self.me


async def follow(params, store, load: Callable) -> None:
    """Forever: the stored parameters (another node's changes) into ``params``, then the movers
    placed again (``params.place()``)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(FOLLOW_INTERVAL)
        try:
            rows = await loop.run_in_executor(None, load, store)
            params.reconcile(rows)
            params.place()
        except Exception:  # noqa: BLE001 - a database outage: the next round tries again
            log.warning("movers: following the stored parameters failed", exc_info=True)
