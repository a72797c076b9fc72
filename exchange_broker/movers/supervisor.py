"""The one owner of every background mover of this node (shovels, federation links).

Each mover is a task running ``mover.run(status)``: the mover opens its connections, calls
``status.running()`` once it moves messages, and returns when it is finished (a shovel's
``delete-after``) or raises when something fails. The supervisor then shows it as ``terminated``
with the reason, waits the mover's ``reconnect_delay`` and starts it again (``starting``). A
failure is logged once per episode (a warning when it begins, info when the mover runs again),
never once per retry: a destination that keeps refusing does not fill the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

log = logging.getLogger("exchange_broker.movers")

Key = tuple[str, str, str]  # (kind, vhost, name)


@dataclass
class Status:
    state: str = "starting"          # starting / running / terminated
    reason: str = ""
    since: float = field(default_factory=time.time)
    finished: bool = False
    on_running: Callable[[], None] = lambda: None

    def set(self, state: str, reason: str = "") -> None:
        self.state, self.reason, self.since = state, reason, time.time()

    def running(self) -> None:
        """The mover moves messages now (it calls this once connected and set up)."""
        self.set("running")
        self.on_running()


class Mover(Protocol):
    reconnect_delay: float

    async def run(self, status: Status) -> None: ...

    def info(self) -> dict: ...


class _Entry:
    def __init__(self, key: Key, mover: Mover) -> None:
        self.key = key
        self.mover = mover
        self.status = Status(on_running=self._running_again)
        self.task: asyncio.Task | None = None
        self.failing = False

    def _running_again(self) -> None:
        if self.failing:  # the end of a failure episode (its start was a warning)
            self.failing = False
            kind, vhost, name = self.key
            log.info("%s '%s' in vhost '%s': running again", kind, name, vhost)


class Supervisor:
    """``start(key, mover)`` (replacing the mover of that key), ``stop``, ``restart``, ``get``,
    ``entries``; ``on_finished(key)`` when a mover returns of itself."""

    def __init__(self) -> None:
        self._entries: dict[Key, _Entry] = {}
        self.on_finished: Callable[[Key], None] = lambda key: None
        self._closed = False

    def start(self, key: Key, mover: Mover) -> None:
        old = self._entries.pop(key, None)
        if old is not None and old.task is not None:
            old.task.cancel()
        if self._closed:
            return
        entry = self._entries[key] = _Entry(key, mover)
        entry.task = asyncio.get_running_loop().create_task(self._run(entry), name=f"mover {key}")

    def stop(self, key: Key) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        if entry.task is not None:
            entry.task.cancel()
        return True

    def restart(self, key: Key) -> bool:
        entry = self._entries.get(key)
        if entry is None:
            return False
        self.start(key, entry.mover)
        return True

    def get(self, key: Key):
        entry = self._entries.get(key)
        return None if entry is None else (entry.mover, entry.status)

    def entries(self, kind: str | None = None) -> list:
        """``(key, mover, status)`` of every mover (of ``kind``)."""
        return [(e.key, e.mover, e.status) for e in self._entries.values() if kind is None or e.key[0] == kind]

    async def close(self) -> None:
        self._closed = True
        entries, self._entries = list(self._entries.values()), {}
        tasks = [e.task for e in entries if e.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=10)

    async def _run(self, entry: _Entry) -> None:
        kind, vhost, name = entry.key
        label = f"{kind} '{name}' in vhost '{vhost}'"
        status = entry.status
        while self._entries.get(entry.key) is entry:  # replaced or stopped: never started again
            status.set("starting")
            try:
                await entry.mover.run(status)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: shown, retried after the delay
                reason = " ".join(str(exc).split()) or type(exc).__name__
                delay = entry.mover.reconnect_delay
                if not entry.failing:
                    log.warning("%s: %s (retrying every %g s while this lasts)", label, reason, delay)
                    entry.failing = True
                else:
                    log.debug("%s: %s", label, reason)
                status.set("terminated", reason)
                await asyncio.sleep(max(delay, 0.01))
                continue
            status.finished = True
            status.set("terminated", "finished")
            log.info("%s: finished", label)
            if self._entries.get(entry.key) is entry:
                del self._entries[entry.key]
                self.on_finished(entry.key)
            return
