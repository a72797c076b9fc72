"""What shovels and federation links do at either end: open the first URI that answers, make
sure a queue exists (passive declare, then a durable declare unless it must be predeclared),
check an exchange, and close quietly."""

from __future__ import annotations

import contextlib

from pamqp import commands

from exchange_broker.movers import uris
from exchange_broker.movers.amqp import Link, LinkError, LocalBroker, connect
from exchange_broker.protocol.names import method


async def open_first(uri_list, vhost: str, local: LocalBroker, name: str) -> tuple[Link, str]:
    """The first of ``uri_list`` that accepts the connection: ``(link, its uri)``; LinkError
    naming each refusal (passwords redacted) when none does."""
    errors = []
    for uri in uri_list:
        try:
            return await connect(uris.parse(uri), vhost, local, name), uri
        except LinkError as exc:
            errors.append(f"{uris.redact(uri)}: {exc}")
    raise LinkError("; ".join(errors))


async def ensure_queue(link: Link, queue: str, arguments: dict, predeclared: bool) -> int:
    """The queue's message count; declared durable (with ``arguments``) if missing and not
    ``predeclared``."""
    ch = await link.channel()
    try:
        ok = await ch.call(method(commands.Queue.Declare, queue=queue, passive=True), commands.Queue.DeclareOk)
        return ok.message_count
    except LinkError as exc:
        if exc.code != 404 or predeclared:
            raise
    finally:
        await close_quietly(ch)
    ch = await link.channel()
    try:
        ok = await ch.call(method(commands.Queue.Declare, queue=queue, durable=True, arguments=arguments),
                           commands.Queue.DeclareOk)
        return ok.message_count
    finally:
        await close_quietly(ch)


async def check_exchange(link: Link, exchange: str) -> None:
    """404 (LinkError) when the exchange does not exist (the default exchange always does)."""
    if exchange == "":
        return
    ch = await link.channel()
    try:
        await ch.call(method(commands.Exchange.Declare, exchange=exchange, passive=True), commands.Exchange.DeclareOk)
    finally:
        await close_quietly(ch)


async def close_quietly(thing) -> None:
    if thing is None:
        return
    with contextlib.suppress(LinkError, OSError):
        await thing.close()
