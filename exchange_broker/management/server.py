"""Run the admin API with uvicorn inside the broker's own event loop.

uvicorn's server is started as a task on the running loop (never its own loop or
thread), without signal handlers (the broker owns SIGTERM/SIGINT) and without its
logging configuration. We bind the listening socket ourselves so that an ephemeral
port (0) is known at once and a bind failure is an ordinary OSError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import uvicorn

from exchange_broker.management.app import create_app
from exchange_broker.management.common import AdminContext
from exchange_broker.management.samples import DEFAULT_INTERVAL

log = logging.getLogger("exchange_broker.admin")


class _InLoopServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # the broker handles signals itself
        yield


class AdminServer:
    def __init__(self, broker, host: str = "127.0.0.1", port: int = 15672, *, amqp_server=None,
                 context: AdminContext | None = None, ssl_options: dict | None = None,
                 sample_interval: float = DEFAULT_INTERVAL, app=None, trust_local_proxy: bool = False) -> None:
        self.broker = broker
        self.ssl_options = dict(ssl_options or {})  # HTTPS: tls.TLSConfig.uvicorn_options()
        self.host = host
        self.port = port
        # ``app``: another ASGI app on this server's socket (a cluster standby's, which forwards
        # every request to the active node); it has no context and samples nothing
        self.context = None if app is not None else \
            context or AdminContext(broker, amqp_server, sample_interval=sample_interval)
        self.app = app if app is not None else create_app(self.context)
        # a cluster node believes X-Forwarded-For from this host only (its standbys forward requests
        # with the real client's address, which guest's loopback-only rule needs)
        self.trust_local_proxy = trust_local_proxy
        self._server: _InLoopServer | None = None
        self._task: asyncio.Task | None = None
        self._sampler: asyncio.Task | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.ssl_options else 'http'}://{host}:{self.port}"

    def _bind(self) -> socket.socket:
        host = self.host
        dual = host == "::" and socket.has_dualstack_ipv6()  # every IPv6 and IPv4 address, as the AMQP listener
        if host == "::" and not dual:
            host = "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, self.port), family=family, backlog=1024, reuse_port=False,
                                    dualstack_ipv6=dual)
        sock.setblocking(False)
        return sock

    async def start(self) -> None:
        sock = self._bind()  # OSError (e.g. address in use) goes to the caller
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, lifespan="off", log_config=None, log_level="warning",
                                access_log=False,
                                timeout_graceful_shutdown=2, server_header=False,
                                proxy_headers=self.trust_local_proxy, forwarded_allow_ips="127.0.0.0/8,::1",
                                timeout_keep_alive=5, **self.ssl_options)
        server = self._server = _InLoopServer(config)
        self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]),
                                                            name="admin-http")
        while not server.started:
            if self._task.done():
                exc = self._task.exception() if not self._task.cancelled() else None
                sock.close()
                if isinstance(exc, OSError):  # e.g. unreadable TLS files (ssl.SSLError is one)
                    raise exc
                raise RuntimeError(f"admin HTTP server failed to start: {exc!r}")
            await asyncio.sleep(0.01)
        if self.context is not None:
            self.context.sample()
            self._sampler = asyncio.get_running_loop().create_task(self._sample(), name="admin-stats")
        bound_host, bound_port = sock.getsockname()[:2]
        bound = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"
        log.info("admin API listening on %s (%s; web UI at /, docs at /api/docs, metrics at /metrics)", bound,
                 "https" if self.ssl_options else "http")

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.context.rates.interval)
            try:
                self.context.sample()
            except Exception:
                log.exception("admin statistics sampling failed")

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 5)
            except (asyncio.TimeoutError, Exception):
                self._server.force_exit = True
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
            self._task = None
