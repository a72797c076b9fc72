"""Clients that open with AMQP 0-9's protocol header ("AMQP 1 1 0 9"): RabbitMQ answers them in
0-9-1 (rabbit_reader's version negotiation), and so does the broker. Python's aioamqp opens that
way (Perl's Net::AMQP clients too: tests/interop/test_perl_anyevent.py)."""

from __future__ import annotations

import asyncio

import pytest
from pamqp import commands

from eb_support import RawClient, uniq

HEADER_0_9 = b"AMQP\x01\x01\x00\x09"


def test_0_9_header_gets_connection_start_and_a_working_connection(broker):
    client = RawClient(broker.port, handshake=False)
    try:
        assert isinstance(client.handshake(protocol_header=HEADER_0_9), commands.Connection.OpenOk)
        assert (client.start.version_major, client.start.version_minor) == (0, 9)
        client.send(1, commands.Channel.Open())
        client.expect_next(commands.Channel.OpenOk, channel=1)
        client.send(1, commands.Queue.Declare(queue="q09", exclusive=True))
        assert client.expect_next(commands.Queue.DeclareOk, channel=1).queue == "q09"
        client.publish(1, "", "q09", b"zero-nine")
        client.send(1, commands.Basic.Get(queue="q09", no_ack=True))
        client.expect_next(commands.Basic.GetOk, channel=1)
        client.close_connection()
    finally:
        client.close()


def test_other_headers_still_get_the_0_9_1_header_and_a_closed_socket(broker):
    client = RawClient(broker.port, handshake=False)
    try:
        client.send_raw(b"AMQP\x01\x01\x00\x0a")  # AMQP 0-10: not spoken here
        client.sock.settimeout(10)
        assert client.sock.recv(8) == b"AMQP\x00\x00\x09\x01"
        assert client.closed_by_peer()
    finally:
        client.close()


def test_aioamqp_declare_publish_confirm_consume_ack(broker):
    aioamqp = pytest.importorskip("aioamqp", reason="aioamqp is a [test] dependency")
    queue = uniq("aio")

    async def run():
        transport, protocol = await aioamqp.connect("127.0.0.1", broker.port)
        try:
            assert protocol.server_properties["product"] == "exchange-broker"
            ch = await protocol.channel()
            declared = await ch.queue_declare(queue, durable=False)
            assert declared["queue"] == queue and declared["message_count"] == 0
            await ch.confirm_select()
            for i in range(3):
                await ch.publish(f"m{i}".encode(), "", queue,
                                 properties={"content_type": "text/plain", "headers": {"i": i}})
            got: list = []
            done = asyncio.get_running_loop().create_future()

            async def on_message(channel, body, envelope, properties):
                got.append((body, properties.content_type, properties.headers, envelope.delivery_tag))
                await channel.basic_client_ack(envelope.delivery_tag)
                if len(got) == 3 and not done.done():
                    done.set_result(None)

            await ch.basic_consume(on_message, queue_name=queue)
            await asyncio.wait_for(done, 15)
            again = await ch.queue_declare(queue, passive=True)
            await ch.queue_delete(queue)
            return got, again
        finally:
            await protocol.close()
            transport.close()

    got, again = asyncio.run(run())
    assert got == [(f"m{i}".encode(), "text/plain", {"i": i}, i + 1) for i in range(3)]
    assert again["message_count"] == 0
