"""Connecting through a cluster failover: keep trying the url's nodes for a while.

While a cluster of this broker fails over (its active node died; a standby takes over within the
failover timeout, 10 s with the defaults), every node refuses or closes new connections. A Spark
task or driver that lost its connection retries the url's nodes, with a growing pause (0.1 s up
to 1 s), for ``reconnectTimeoutMs`` (default 30 s) before it fails. Refusals where the broker
answered (a wrong password, a vhost or queue that does not exist) are never retried.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

from .amqp import Connection, ConnectionClosed, ConnectionFailed, ConnectionParams

log = logging.getLogger("spark_integration.failover")

T = TypeVar("T")


def connect_retrying(params: ConnectionParams, retry_for: float, setup: Callable[[Connection], T] = None,
                     *, prefer: int = 0, **kw) -> tuple[Connection, T | None]:
    """``Connection.connect`` then ``setup(conn)``, again until both succeed or ``retry_for`` s
    have passed since the first try. Returns ``(conn, setup's result)``."""
    deadline = time.monotonic() + retry_for
    pause = 0.1
    tries = 0
    while True:
        conn = None
        try:
            conn = Connection.connect(params, prefer=prefer + tries, **kw)
            return conn, (setup(conn) if setup is not None else None)
        except (ConnectionFailed, ConnectionClosed) as exc:
            if conn is not None:
                conn.abort()
            if getattr(exc, "code", None) and not isinstance(exc, ConnectionClosed):
                raise  # the broker answered: credentials, vhost
            if time.monotonic() + pause > deadline:
                raise
            if tries == 0:
                log.warning("AMQP nodes of %s unreachable (%s); retrying for up to %.0f s (a cluster may be "
                            "failing over)", params.redacted(), exc, retry_for)
        except BaseException:  # ChannelClosed (a missing queue...) and everything else: no retry
            if conn is not None:
                conn.abort()
            raise
        tries += 1
        time.sleep(pause)
        pause = min(pause * 2, 1.0)
