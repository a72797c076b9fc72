"""Connection hand-off (leaders mode, unless ``serve --no-cluster-connection-handoff``): a client
connection whose first queue-bound request (a publish to the default exchange, basic.consume,
basic.get) names a queue another node leads is handed to that leader, and this node passes its
bytes through from then on.

Forwarding message by message (``remote.py``) reads every frame twice and writes it twice: a
forwarded message costs about twice the CPU of a local one. A handed-off connection costs this
node a read and a write per TCP segment and the leader what a local client costs it. The
session's side is ``connection/handoff.py``: it offers the connection only while it holds
nothing the client could miss (no consumer, delivery, confirm, transaction or exclusive queue).

The hand-off opens a TCP connection to the leader's AMQP listener (with a PROXY line naming the
client when the leader is on this host, as ``forward.py`` does), logs in with the client's own
login (PLAIN or AMQPLAIN, so the leader checks the user and its permissions itself), tunes to
what the client tuned to, opens the same vhost and the client's channels again (confirm mode and
basic.qos included), and swallows those replies; then the client's request and everything after
it go to the leader as sent, and the leader's output to the client. If the leader cannot be
reached or refuses, the connection stays here and is served as before.

Limits: the connection then lives and dies with the leader: if the leader goes, the client's
connection is closed (its client reconnects, and its unconfirmed publishes are its to send
again); queues led by other nodes are reached from the leader, through its placeholders. A
leader can leave the cluster with its sockets still open (cut off from the database or paused
past its lease, and evicted): at the first beat that no longer finds it live, this node closes
the connections it handed to it (``live_now``), so their clients reconnect to a node that serves
their queues instead of waiting on one that cannot confirm.
"""

from __future__ import annotations

import asyncio
import logging

from pamqp import commands

from exchange_broker.cluster.forward import proxy_line
from exchange_broker.cluster.links import spawn
from exchange_broker.cluster.remote import RemoteQueue
from exchange_broker.core.auth import is_loopback
from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import FRAME_METHOD, PROTOCOL_HEADER
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.protocol.frames import frame_at

log = logging.getLogger("exchange_broker.cluster")

HANDOFF_TIMEOUT = 5.0  # s for the leader to take the connection, else it stays here

_C = commands.Connection
_REPLIES = (commands.Channel.OpenOk, commands.Confirm.SelectOk, commands.Basic.QosOk)


class HandOff:
    """``broker.handoff``: decides, and starts the hand-off of a connection it takes."""

    def __init__(self, timeout: float = HANDOFF_TIMEOUT) -> None:
        self.timeout = timeout
        self.handed = 0  # connections handed off (for tests and the log)
        self.piped: dict[str, set[Upstream]] = {}  # leader node name -> its open pipes

    def live_now(self, live) -> None:
        """The cluster's live nodes, read at a beat (``LeaderNode.on_live``): the connections handed
        to a node that is not one of them any more (evicted) are closed, both ways. A node being
        drained is live: like its own clients, the clients handed to it stay, and reach the
        queues it no longer leads through its placeholders."""
        for node in [node for node in self.piped if node not in live]:
            pipes = self.piped.pop(node)
            log.warning("cluster: node %s left the cluster: closing the %d client connection(s) handed off "
                        "to it (their clients reconnect)", node, len(pipes))
            for up in pipes:
                up.cut()

    def __call__(self, session, event, exchange: str, name: str) -> bool:
        if exchange or not name or session.vhost is None or session.pipe_to is None or session.from_link:
            return False  # (another node's link: what it forwards is nacked here, never passed on)
        q = session.vhost.queues.get(name)
        if type(q) is not RemoteQueue or q.address is None or q.deleted or not session.holds_nothing():
            return False
        pending = session.suspend(event)
        spawn(self._connect(session, q, pending))
        return True

    async def _connect(self, session, q: RemoteQueue, pending: bytes) -> None:
        host, port = q.address
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        up: Upstream | None = None
        try:
            async with asyncio.timeout(self.timeout):  # (not wait_for, which can lose a cancel)
                _transport, up = await loop.create_connection(
                    lambda: Upstream(self, session, pending, done, q.leader), host, port)
            async with asyncio.timeout(self.timeout):
                await asyncio.shield(done)
        except (OSError, asyncio.TimeoutError) as exc:
            why = "no answer in time" if isinstance(exc, asyncio.TimeoutError) else " ".join(str(exc).split())
            log.info("connection %s stays on this node: the leader of %s at %s:%s does not take it: %s",
                     session.name, q.describe(), host, port, why)
            if up is not None:
                up.abandon()
            if not session.closed:
                session.resume(pending)


def _reading(transport: asyncio.Transport | None, on: bool) -> None:
    if transport is not None and not transport.is_closing():
        if on:
            transport.resume_reading()
        else:
            transport.pause_reading()


class Upstream(asyncio.Protocol):
    """The connection to the leader: a handshake on the client's behalf, then a pipe."""

    def __init__(self, owner: HandOff, session, pending: bytes, done: asyncio.Future, leader: str) -> None:
        self.owner = owner
        self.leader = leader  # the node's name
        self.session = session
        self.pending = pending
        self.done = done
        self.transport: asyncio.Transport | None = None
        self.client: asyncio.Transport | None = None  # the client's transport, once piped
        self.buf = bytearray()
        self.waiting = 0  # replies of the replayed channel set-up still to come

    # -- the pipe (the listener calls write/close/pause_reading/resume_reading) ----------------------
    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def pause_reading(self) -> None:
        _reading(self.transport, False)

    def resume_reading(self) -> None:
        _reading(self.transport, True)

    def pause_writing(self) -> None:  # the leader's side is full: stop reading the client
        _reading(self.client, False)

    def resume_writing(self) -> None:
        _reading(self.client, True)

    def eof_received(self) -> bool:
        return False

    def connection_made(self, transport) -> None:
        self.transport = transport
        sess = self.session
        seen_as = transport.get_extra_info("sockname")
        if sess.peer and sess.peer[0] and seen_as and is_loopback(seen_as[0]):
            transport.write(proxy_line(tuple(sess.peer[:2]), transport.get_extra_info("peername")))
        transport.write(PROTOCOL_HEADER)

    def connection_lost(self, exc) -> None:
        self.transport = None
        pipes = self.owner.piped.get(self.leader)
        if pipes is not None:
            pipes.discard(self)
            if not pipes:
                del self.owner.piped[self.leader]
        if self.client is not None:
            self.client.close()  # what was written goes out first
        elif not self.done.done():
            self.done.set_exception(OSError("the leader closed the connection"))

    def cut(self) -> None:
        """The leader left the cluster: both ends close (the client's once the leader's has)."""
        if self.transport is not None:
            self.transport.abort()

    def abandon(self) -> None:
        """The hand-off failed or timed out: the connection stays with this node."""
        if not self.done.done():
            self.done.cancel()
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.client is not None:
            self.client.write(data)
            return
        if self.done.done():
            return
        self.buf += data
        try:
            self._handshake()
        except (AMQPError, ValueError, KeyError, TypeError) as exc:  # UnicodeError is a ValueError
            self.done.set_exception(OSError(str(exc)))

    # -- the handshake ------------------------------------------------------------------------------
    def _send(self, channel: int, method) -> None:
        self.transport.write(codec.method_frame(channel, method))

    def _handshake(self) -> None:
        buf, pos = self.buf, 0
        while True:
            got = frame_at(buf, pos, len(buf))
            if got is None:
                break
            ftype, channel, end = got
            payload = bytes(buf[pos + 7:end])
            pos = end + 1
            if ftype != FRAME_METHOD:
                continue  # a heartbeat
            if self._step(channel, codec.decode_method(payload)):
                rest = bytes(buf[pos:])
                buf.clear()
                self._pipe(rest)
                return
        del buf[:pos]

    def _step(self, channel: int, m) -> bool:
        """One reply of the leader; True once the connection is set up as the client's was."""
        sess, conn = self.session, self.session.conn
        if isinstance(m, _C.Start):
            mechanism, response = sess.login_response
            offered = m.mechanisms.decode() if isinstance(m.mechanisms, bytes) else str(m.mechanisms)
            if mechanism not in offered.split():
                raise ValueError(f"the leader does not take {mechanism} logins")
            self._send(0, _C.StartOk(client_properties=sess.client_properties, mechanism=mechanism,
                                     response=response.decode("utf-8"), locale="en_US"))
        elif isinstance(m, _C.Tune):
            if (m.frame_max and m.frame_max < conn.frame_max) or (m.channel_max and m.channel_max < conn.channel_max):
                raise ValueError("the leader's frame_max or channel_max is lower than this connection's")
            self._send(0, _C.TuneOk(channel_max=conn.channel_max, frame_max=conn.frame_max,
                                    heartbeat=conn.heartbeat))
            self._send(0, _C.Open(virtual_host=sess.vhost.name))
        elif isinstance(m, _C.OpenOk):
            for number, ch in sorted(sess.channels.items()):
                self._send(number, commands.Channel.Open())
                self.waiting += 1
                if ch.confirm:
                    self._send(number, commands.Confirm.Select())
                    self.waiting += 1
                for count, is_global in ((ch.prefetch, False), (ch.global_prefetch, True)):
                    if count:
                        self._send(number, commands.Basic.Qos(prefetch_count=count, global_=is_global))
                        self.waiting += 1
            return self.waiting == 0
        elif isinstance(m, _REPLIES):
            self.waiting -= 1
            return self.waiting == 0
        elif isinstance(m, _C.Close):
            self._send(0, _C.CloseOk())
            raise ValueError(f"the leader refused: {m.reply_code} {m.reply_text}")
        else:
            raise ValueError(f"unexpected {m.name} from the leader")
        return False

    def _pipe(self, rest: bytes) -> None:
        sess = self.session
        client = sess.pipe_to(self) if not sess.closed else None
        if client is None:  # the client hung up meanwhile
            self.transport.close()
            self.done.set_result(True)
            return
        self.client = client
        self.owner.handed += 1
        self.owner.piped.setdefault(self.leader, set()).add(self)
        peer = self.transport.get_extra_info("peername") or ("?", 0)
        sess.handed_off(f"the queue's leader at {peer[0]}:{peer[1]}")
        self.transport.write(self.pending)
        self.pending = b""
        if rest:
            client.write(rest)
        self.done.set_result(True)
