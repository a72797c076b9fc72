"""Replies leave in the order the requests arrived, however many arrive in one read (issue 12, §1).

Each test writes a whole scripted sequence of frames with one ``sendall`` and reads back every
frame the broker sends until connection.close-ok, on the in-memory broker and on a broker with a
SQLite store, where replies that promise a stored definition (declare-ok & co.) and confirms of
persistent messages wait for the store's commit: what the client asked later waits behind them.
"""

from __future__ import annotations

import socket
import time

import pytest
from pamqp import body as pbody
from pamqp import commands as C
from pamqp import frame as pframe
from pamqp import header as pheader

from eb_support import RawClient, uniq

from exchange_broker.connection.session import CLOSE_LINGER


def f(method, channel: int = 1) -> bytes:
    return pframe.marshal(method, channel)


def publish(routing_key: str, body: bytes, channel: int = 1, *, exchange: str = "",
            mandatory: bool = False, persistent: bool = False) -> bytes:
    props = C.Basic.Properties(delivery_mode=2 if persistent else None)
    return (f(C.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory), channel)
            + f(pheader.ContentHeader(0, len(body), props), channel) + f(pbody.ContentBody(body), channel))


def run_script(port: int, *frames: bytes) -> list[tuple[int, str]]:
    """Log in, write ``frames`` in one sendall, and return (channel, frame name) of every frame
    the broker sends until connection.close-ok; the client then hangs up."""
    client = RawClient(port)
    try:
        client.sock.sendall(b"".join(frames))
        got = []
        while True:
            frame = client.read_frame(timeout=10)
            assert frame is not None, f"socket closed before connection.close-ok; got {got}"
            channel, method = frame
            got.append((channel, method.name))
            if isinstance(method, C.Connection.CloseOk):
                return got
    finally:
        client.close()


BYE = (f(C.Channel.Close(200, "bye", 0, 0)), f(C.Connection.Close(200, "bye", 0, 0), 0))


@pytest.fixture(params=["in-memory", "sqlite"])
def port(request):
    """A broker without a store, and one with a SQLite store (replies wait for its commits)."""
    if request.param == "in-memory":
        return request.getfixturevalue("broker").port
    workdir = request.getfixturevalue("workdir")
    return request.getfixturevalue("spawn_broker")("--data-dir", str(workdir / "data")).port


def test_open_declare_close_close_in_one_write(port):
    q = uniq("order")
    got = run_script(port, f(C.Channel.Open()), f(C.Queue.Declare(queue=q, durable=True)), *BYE)
    assert got == [(1, "Channel.OpenOk"), (1, "Queue.DeclareOk"), (1, "Channel.CloseOk"),
                   (0, "Connection.CloseOk")]
    # the queue really exists (the declare was not just answered)
    got = run_script(port, f(C.Channel.Open()), f(C.Queue.Delete(queue=q)), *BYE)
    assert got == [(1, "Channel.OpenOk"), (1, "Queue.DeleteOk"), (1, "Channel.CloseOk"),
                   (0, "Connection.CloseOk")]


def test_confirm_mode_unroutable_mandatory_then_close(port):
    """basic.return and then the confirm go out before the channel's close-ok."""
    got = run_script(port, f(C.Channel.Open()), f(C.Confirm.Select()),
                     publish(uniq("nowhere"), b"lost", mandatory=True), *BYE)
    assert got == [(1, "Channel.OpenOk"), (1, "Confirm.SelectOk"), (1, "Basic.Return"),
                   (1, "ContentHeader"), (1, "ContentBody"), (1, "Basic.Ack"), (1, "Channel.CloseOk"),
                   (0, "Connection.CloseOk")]


def test_persistent_confirms_before_close_ok_and_a_reopened_channel_behind(port):
    """Confirms of persistent messages (waiting for the store's commit) precede the close-ok; a
    channel reopened with the same number in the same write is answered after them."""
    q = uniq("order")
    got = run_script(port, f(C.Channel.Open()), f(C.Queue.Declare(queue=q, durable=True)),
                     f(C.Confirm.Select()),
                     *[publish(q, b"m%d" % i, persistent=True) for i in range(3)],
                     f(C.Channel.Close(200, "bye", 0, 0)), f(C.Channel.Open()),
                     f(C.Queue.Declare(queue=q, passive=True)), f(C.Queue.Delete(queue=q)),
                     *BYE)
    acks = [name for _, name in got if name == "Basic.Ack"]
    assert 1 <= len(acks) <= 3  # coalesced (multiple=true) as the commits come
    assert [x for x in got if x[1] != "Basic.Ack"] == [
        (1, "Channel.OpenOk"), (1, "Queue.DeclareOk"), (1, "Confirm.SelectOk"), (1, "Channel.CloseOk"),
        (1, "Channel.OpenOk"), (1, "Queue.DeclareOk"), (1, "Queue.DeleteOk"), (1, "Channel.CloseOk"),
        (0, "Connection.CloseOk")]
    assert got.index((1, "Basic.Ack")) > got.index((1, "Confirm.SelectOk"))
    assert max(i for i, x in enumerate(got) if x[1] == "Basic.Ack") < got.index((1, "Channel.CloseOk"))


def test_later_replies_and_deliveries_wait_behind_a_declare_ok(port):
    """declare (durable: its declare-ok waits for the store), bind, consume, publish, qos: in
    that order, the delivery after consume-ok."""
    q = uniq("order")
    got = run_script(port, f(C.Channel.Open()), f(C.Queue.Declare(queue=q, durable=True, auto_delete=True)),
                     f(C.Queue.Bind(queue=q, exchange="amq.direct", routing_key=q)),
                     f(C.Basic.Consume(queue=q, consumer_tag="c1", no_ack=True)),
                     publish(q, b"hello", exchange="amq.direct"), f(C.Basic.Qos(0, 5)), *BYE)
    assert got == [(1, "Channel.OpenOk"), (1, "Queue.DeclareOk"), (1, "Queue.BindOk"),
                   (1, "Basic.ConsumeOk"), (1, "Basic.Deliver"), (1, "ContentHeader"),
                   (1, "ContentBody"), (1, "Basic.QosOk"), (1, "Channel.CloseOk"),
                   (0, "Connection.CloseOk")]


def test_many_channels_and_declares_in_one_write(port):
    names = [uniq("order") for _ in range(30)]
    frames = [f(C.Channel.Open(), ch) for ch in (1, 2, 3)]
    for i, q in enumerate(names):
        frames.append(f(C.Queue.Declare(queue=q, durable=True, auto_delete=i % 2 == 0), 1 + i % 3))
    frames += [f(C.Queue.Delete(queue=q), 1 + i % 3) for i, q in enumerate(names)]
    frames += [f(C.Channel.Close(200, "", 0, 0), ch) for ch in (1, 2, 3)]
    got = run_script(port, *frames, f(C.Connection.Close(200, "", 0, 0), 0))
    for ch in (1, 2, 3):  # per channel: exactly the requests' order
        mine = [name for c, name in got if c == ch]
        assert mine == ["Channel.OpenOk"] + ["Queue.DeclareOk"] * 10 + ["Queue.DeleteOk"] * 10 + \
            ["Channel.CloseOk"]
    assert got[-1] == (0, "Connection.CloseOk") and len(got) == 3 * 22 + 1


def test_a_channel_error_mid_write_drops_that_channels_later_frames_only(port):
    q = uniq("order")
    missing = uniq("missing")
    frames = [f(C.Channel.Open(), 1), f(C.Channel.Open(), 2),
              f(C.Queue.Declare(queue=q, durable=True, auto_delete=True), 1),
              f(C.Queue.Declare(queue=missing, passive=True), 1),  # 404: channel 1 closed
              f(C.Basic.Qos(0, 1), 1),                            # dropped: channel 1 is closing
              f(C.Basic.Qos(0, 2), 2)]
    client = RawClient(port)
    try:
        client.sock.sendall(b"".join(frames))
        got = [client.next() for _ in range(5)]
        names = [(ch, m.name) for ch, m in got]
        assert names[:2] == [(1, "Channel.OpenOk"), (2, "Channel.OpenOk")]
        assert [x for x in names if x[0] == 1][1:] == [(1, "Queue.DeclareOk"), (1, "Channel.Close")]
        assert (2, "Basic.QosOk") in names
        close = next(m for ch, m in got if isinstance(m, C.Channel.Close))
        assert close.reply_code == 404 and missing in close.reply_text
        client.send(1, C.Channel.CloseOk())
        client.send(0, C.Connection.Close(200, "", 0, 0))
        client.expect_next(C.Connection.CloseOk, channel=0)
    finally:
        client.close()


def test_close_ok_is_written_before_the_socket_closes_and_the_client_hangs_up_first(broker):
    """After connection.close-ok the broker waits for the client to hang up (reading and dropping
    what still comes), and closes the socket itself only if the client does not."""
    client = RawClient(broker.port, open_channel=1)
    try:
        client.sock.sendall(f(C.Connection.Close(200, "bye", 0, 0), 0)
                            + publish("late", b"after close" * 1000) * 50)
        client.expect_next(C.Connection.CloseOk, channel=0)
        client.sock.settimeout(0.5)
        with pytest.raises(socket.timeout):  # not closed under the client ...
            client.sock.recv(1)
        t0 = time.monotonic()
        assert client.closed_by_peer(timeout=CLOSE_LINGER + 5)  # ... but not kept open forever
        assert time.monotonic() - t0 < CLOSE_LINGER + 2
    finally:
        client.close()


def test_tx_commit_ok_before_later_replies_and_close_ok(port):
    """tx.commit-ok waits for the store (persistent messages of the transaction): the replies
    after it wait too, and it is still sent when the channel is closed in the same write."""
    q = uniq("order")
    got = run_script(port, f(C.Channel.Open()), f(C.Queue.Declare(queue=q, durable=True)), f(C.Tx.Select()),
                     publish(q, b"in a transaction", persistent=True), f(C.Tx.Commit()),
                     f(C.Basic.Qos(0, 1)), f(C.Queue.Delete(queue=q)), *BYE)
    assert got == [(1, "Channel.OpenOk"), (1, "Queue.DeclareOk"), (1, "Tx.SelectOk"), (1, "Tx.CommitOk"),
                   (1, "Basic.QosOk"), (1, "Queue.DeleteOk"), (1, "Channel.CloseOk"),
                   (0, "Connection.CloseOk")]
