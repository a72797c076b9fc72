"""movers/supervisor.py on its own (no broker): a mover replaced or stopped is never started
again, even when its run did not end at the cancel (a cancel lost inside a library call)."""

from __future__ import annotations

import asyncio

from exchange_broker.movers.supervisor import Status, Supervisor


class Deaf:
    """A mover whose run does not end at the first cancel: it goes on, then fails (as a run that
    had a cancel swallowed would fail later, when its connection went)."""

    reconnect_delay = 0.01

    def __init__(self) -> None:
        self.runs = 0

    async def run(self, status: Status) -> None:
        self.runs += 1
        status.running()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # lost
        raise ConnectionError("the link went")

    def info(self) -> dict:
        return {}


def test_a_replaced_mover_that_missed_its_cancel_is_not_started_again():
    async def scenario():
        sup = Supervisor()
        key = ("shovel", "/", "s")
        old, new = Deaf(), Deaf()
        sup.start(key, old)
        await asyncio.sleep(0.01)
        sup.start(key, new)  # replaced
        await asyncio.sleep(0.1)  # ten of old's retry delays
        assert (old.runs, new.runs) == (1, 1)
        assert sup.get(key)[0] is new
        assert sup.stop(key)
        await asyncio.sleep(0.1)
        assert new.runs == 1
        await sup.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))
