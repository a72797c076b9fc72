"""The one place the movers import their AMQP client from (``exchange_broker.client``: open,
channel, confirm_select, publish with a confirm future, consume with prefetch, ack/nack, call).

:func:`connect` opens a connection to an :class:`~exchange_broker.movers.uris.Endpoint`; one with
no host is this broker, reached over loopback with the broker's internal login (``local``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from exchange_broker.client import Channel as LinkChannel
from exchange_broker.client import ClientError as LinkError
from exchange_broker.client import Connection, Delivery
from exchange_broker.movers.uris import Endpoint

__all__ = ["Delivery", "Link", "LinkChannel", "LinkError", "LocalBroker", "connect", "tls_context"]


class Link(Connection):
    """The client's connection, with the server's ``cluster_name`` (federation records it in
    ``x-received-from``)."""

    @property
    def cluster_name(self) -> str:
        name = (self.server_properties or {}).get("cluster_name", "")
        return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


@dataclass
class LocalBroker:
    """How to reach this broker: its AMQP listener and the internal login (Broker.movers_login)."""
    host: str = "127.0.0.1"
    port: int = 0
    user: str = ""
    password: str = ""


def tls_context(ep: Endpoint) -> tuple[ssl.SSLContext, str | None]:
    """The TLS context of an ``amqps://`` endpoint (RabbitMQ's URI query parameters) and the
    server name to send and check ("" for none); LinkError naming a file that does not load."""
    opts = ep.tls or {}
    verify = opts.get("verify", "verify_peer") == "verify_peer"
    try:
        ctx = ssl.create_default_context(cafile=opts.get("cacertfile"))
        if "certfile" in opts:
            ctx.load_cert_chain(opts["certfile"], opts.get("keyfile"))
    except (OSError, ssl.SSLError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise LinkError(f"TLS options of {ep.host}:{ep.port}: {why}") from None
    sni = opts.get("server_name_indication")
    if sni == "disable" or not verify:
        ctx.check_hostname = False
    if not verify:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx, ("" if sni == "disable" else sni or ep.host)


async def connect(ep: Endpoint, vhost: str, local: LocalBroker, name: str) -> Link:
    """Open a connection; ``vhost`` is used when the URI names none (LinkError when refused)."""
    if ep.local:
        if not local.port:
            raise LinkError("this broker's AMQP listener is not up yet")
        return await Link.open(local.host, local.port, local.user, local.password,
                               ep.vhost if ep.vhost is not None else vhost, name=name, heartbeat=0)
    ctx, server_name = tls_context(ep) if ep.tls is not None else (None, None)
    return await Link.open(ep.host, ep.port, ep.user, ep.password, ep.vhost if ep.vhost is not None else "/",
                           name=name, heartbeat=ep.heartbeat, timeout=ep.timeout, ssl=ctx,
                           server_hostname=server_name)
