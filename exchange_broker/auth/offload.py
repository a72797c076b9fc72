"""Running a backend's network work off the event loop, with a timeout, and the coroutine every
asyncio protocol (the admin API, MQTT) awaits a login with.

``Offload`` runs a blocking function in a small thread pool of its own and calls back on the
loop with its result (or exception). After ``timeout`` seconds the callback gets a TimeoutError
instead and a late result is dropped: a hung identity server never hangs a connection.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from exchange_broker.core.auth_backends import AuthenticatedUser, LoginRefused

log = logging.getLogger("exchange_broker.auth")


class Offload:
    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float, workers: int = 4) -> None:
        self.loop = loop
        self.timeout = timeout
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="auth-backend")

    def __call__(self, fn: Callable[[], Any], on_done: Callable[[Any], None]) -> None:
        answered = False

        def deliver(result: Any) -> None:
            nonlocal answered
            if not answered:
                answered = True
                timer.cancel()
                on_done(result)

        def finished(fut) -> None:
            exc = fut.exception()
            deliver(exc if exc is not None else fut.result())

        timer = self.loop.call_later(self.timeout, deliver,
                                     TimeoutError(f"no answer within {self.timeout:g} s"))
        self.loop.run_in_executor(self.executor, fn).add_done_callback(finished)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


async def authenticate(broker, username: str, password: str | None, peer_host: str,
                       mechanism: str = "PLAIN", conn_name: str = "") -> AuthenticatedUser:
    """``Broker.login`` as a coroutine: the AuthenticatedUser, or raises LoginRefused (already
    logged by the broker, with each backend's reason)."""
    fut = asyncio.get_running_loop().create_future()
    broker.login(username, password, peer_host, mechanism,
                 lambda r: fut.done() or fut.set_result(r), conn_name)
    result = await fut
    if isinstance(result, LoginRefused):
        raise result
    return result
