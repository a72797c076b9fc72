"""A small blocking AMQP 0-9-1 connection with one channel (the Spark reader, sink and drain).

Why not pika: ``BlockingChannel.close()``/``basic_cancel()`` nack every delivery buffered but
not yet handed out, which is not "requeue by closing" on a classic queue and is a connection
error (540) on a stream queue.  This client never nacks: unacked deliveries go back to the
queue when the channel or connection closes, as the AMQP spec says.

One channel (1), PLAIN auth, optional TLS, a heartbeat thread (the connection stays alive
while the caller is busy, e.g. a long Spark write with deliveries held unacked), declare,
qos/consume/cancel/ack; publishing with confirms and returns is in ``publishing.py``.
The wire is the project's one codec, ``exchange_broker.protocol`` (plain AMQP 0-9-1, so any
broker will do): the handshake is its sans-IO ``ClientConnection``, deliveries are parsed by
``frames.parse_frames`` straight out of the receive buffer with its frame primitives, other
methods are decoded by its ``codec.decode_method`` (pamqp).
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time

from pamqp import commands

from exchange_broker.protocol import codec as wire
from exchange_broker.protocol import events as wire_events
from exchange_broker.protocol.client import ClientConnection
from exchange_broker.protocol.errors import AMQPError as WireError
from exchange_broker.protocol.frames import HEARTBEAT_FRAME, ack_frame, method_id_at, tag_bits_at

from .batch import STRIDE, DeliveryBatch
from .codec import MAX_PREFETCH, Delivery
from .frames import parse_frames
from .errors import AMQPError, ChannelClosed, ConnectionClosed, ConnectionFailed, ConsumerCancelled
from .params import ConnectionParams
from .publishing import Publishing
from .queues import QueueMethods

__all__ = ["Connection"]

SEND_TIMEOUT = 120.0  # a broker that takes nothing for this long is treated as dead
RECV_SIZE = 1 << 20   # bytes asked of one recv(): fewer, larger reads to parse

_M_ACK = (60 << 16) | 80
_M_NACK = (60 << 16) | 120
_M_RETURN = (60 << 16) | 50


class Connection(QueueMethods, Publishing):
    """A blocking connection with one channel.  Not thread-safe (apart from the heartbeat sender)."""

    def __init__(self, params: ConnectionParams, client_name: str = "spark-amqp") -> None:
        self.params = params
        self.client_name = client_name
        self.node: tuple[str, int] = (params.host, params.port)   # the node we are connected to
        self._sock: socket.socket | None = None
        self._rest = b""                     # received bytes not parsed yet (a partial frame)
        self._ctag_cache: dict[bytes, str] = {}          # raw consumer tag -> str
        self._name_cache: dict[bytes, tuple[str, str]] = {}  # raw exchange+key -> strs
        self._deliveries: list = []          # flat columns, STRIDE entries a delivery (batch.py)
        self._dpos = 0                       # where the next undelivered one starts in it
        # delivery being assembled: [tag, redelivered, exchange, rkey, props, left, chunks, ctag]
        self._partial: list | None = None
        self._replies: list = []             # cold method frames received on channel 1 / 0
        self._handshaking: ClientConnection | None = None  # the sans-IO client, until open-ok
        self._send_lock = threading.Lock()
        self._last_send = time.monotonic()
        self._last_recv = time.monotonic()
        self._hb_thread: threading.Thread | None = None
        self._hb_stop = threading.Event()
        self.frame_max = 131072
        self.heartbeat = 0
        self.server_properties: dict = {}
        self.closed: AMQPError | None = None
        self.cancelled: set[str] = set()
        self.consumer_tags: list[str] = []
        self._init_publishing()

    # ------------------------------------------------------------------ setup
    @classmethod
    def connect(cls, url_or_params: str | ConnectionParams, prefer: int = 0,
                **kw) -> "Connection":
        """Connect to the first reachable node, trying them in order from node ``prefer``
        (mod their count).  Login and vhost errors are not retried on other nodes."""
        params = (url_or_params if isinstance(url_or_params, ConnectionParams)
                  else ConnectionParams.from_url(url_or_params))
        nodes = params.nodes()
        first_error: ConnectionFailed | None = None
        for i in range(len(nodes)):
            node = nodes[(prefer + i) % len(nodes)]
            conn = cls(params, **kw)
            conn.node = node
            try:
                conn._open()
                return conn
            except ConnectionFailed as exc:
                if exc.code:                 # the broker answered: credentials, vhost...
                    raise
                first_error = first_error or exc
        assert first_error is not None
        if len(nodes) > 1:
            raise ConnectionFailed(f"cannot connect to any of {len(nodes)} AMQP nodes "
                                   f"({params.redacted()}); first error: {first_error}")
        raise first_error

    def _open(self) -> None:
        p = self.params
        host, port = self.node
        where = f"{host}:{port}"
        try:
            sock = socket.create_connection((host, port), timeout=p.connect_timeout)
        except OSError as exc:
            raise ConnectionFailed(f"cannot connect to AMQP broker at {where}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if p.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        sock.settimeout(max(p.connect_timeout, SEND_TIMEOUT))
        self._sock = sock
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)
        try:
            self._handshake()
        except AMQPError as exc:
            self._drop()
            if isinstance(exc, ConnectionFailed):
                raise
            raise ConnectionFailed(f"AMQP handshake with {where} (vhost {p.vhost!r}, user "
                                   f"{p.username!r}) failed: {exc}", exc.code, exc.text) from None
        except (OSError, ValueError) as exc:
            self._drop()
            raise ConnectionFailed(f"AMQP handshake with {where} failed: {exc}") from None

    def _handshake(self) -> None:
        p = self.params
        caps = {"authentication_failure_close": True, "consumer_cancel_notify": True,
                "publisher_confirms": True, "basic.nack": True, "connection.blocked": True}
        proto = self._handshaking = ClientConnection(
            p.username, p.password, p.vhost, heartbeat=p.heartbeat, frame_max=131072,
            client_properties={"product": self.client_name, "capabilities": caps})
        self._send(proto.data_to_send())
        deadline = time.monotonic() + p.connect_timeout
        while self._handshaking is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(ConnectionClosed("timed out waiting for the broker's handshake"))
            self._recv(left)
        self._send_method(1, commands.Channel.Open())
        self._expect(1, commands.Channel.OpenOk, p.connect_timeout)
        if self.heartbeat:
            self._hb_thread = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                               name="amqp-heartbeat")
            self._hb_thread.start()

    def _handshake_data(self, data: bytes) -> None:
        proto = self._handshaking
        try:
            events = proto.receive_data(data)
        except WireError as exc:
            raise ConnectionFailed(str(exc), exc.code if exc.code == 403 else 0) from None
        out = proto.data_to_send()
        if out:
            self._send(out)
        for e in events:
            if type(e) is wire_events.Connected:
                self._handshaking = None
                self.server_properties = e.server_properties
                self.frame_max, self.heartbeat = e.frame_max, e.heartbeat
            elif type(e) is wire_events.Closing:
                raise self._fail(ConnectionClosed(f"broker closed the connection: {e.code} {e.text}",
                                                  e.code, e.text))

    def _heartbeat_loop(self) -> None:
        interval = max(self.heartbeat / 2.0, 0.5)
        while not self._hb_stop.wait(interval):
            if time.monotonic() - self._last_send >= interval:
                try:
                    self._send(HEARTBEAT_FRAME)
                except (AMQPError, OSError):
                    return

    # ------------------------------------------------------------------ I/O
    def _send(self, data: bytes) -> None:
        sock = self._sock
        if sock is None:
            raise self.closed or ConnectionClosed("connection is closed")
        try:
            with self._send_lock:
                sock.sendall(data)
                self._last_send = time.monotonic()
        except OSError as exc:
            raise self._fail(ConnectionClosed(f"connection lost: {exc}")) from None

    def _send_method(self, channel: int, method) -> None:
        self._send(wire.method_frame(channel, method))

    def _fail(self, exc: AMQPError) -> AMQPError:
        if self.closed is None:
            self.closed = exc
        self._drop()
        return exc

    def _recv(self, timeout: float | None) -> bool:
        """Read once from the socket (waiting at most ``timeout`` s) and parse what arrived.

        Returns False on timeout.  Raises ConnectionClosed when the peer went away.
        """
        sock = self._sock
        if sock is None:
            raise self.closed or ConnectionClosed("connection is closed")
        try:
            # wait with poll(); the socket itself keeps one fixed (long) timeout, which
            # sendall() -- also used by the heartbeat thread -- relies on
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                wait = -1 if timeout is None else max(0, int(timeout * 1000))
                if not self._poller.poll(wait):
                    if self.heartbeat and time.monotonic() - self._last_recv > 2.5 * self.heartbeat:
                        raise self._fail(ConnectionClosed("missed heartbeats from the broker"))
                    return False
            data = sock.recv(RECV_SIZE)
        except (socket.timeout, BlockingIOError, ssl.SSLWantReadError):
            return False
        except OSError as exc:
            raise self._fail(ConnectionClosed(f"connection lost: {exc}")) from None
        if not data:
            raise self._fail(ConnectionClosed("connection closed by the broker (socket EOF)"))
        self._last_recv = time.monotonic()
        self._parse(data)
        return True

    def _parse(self, data: bytes) -> None:
        if self._handshaking is not None:
            self._handshake_data(data)
            return
        buf = self._rest + data if self._rest else data
        pos = parse_frames(self, buf)
        self._rest = buf[pos:] if pos < len(buf) else b""

    def _on_method(self, channel: int, payload: bytes) -> None:
        cm = method_id_at(payload, 0)
        if cm == _M_ACK or cm == _M_NACK:   # publisher confirms
            tag, bits = tag_bits_at(payload, 0)
            self._on_confirm(cm == _M_NACK, tag, bool(bits & 1))
            return
        try:
            method = wire.decode_method(payload)
        except WireError as exc:
            raise self._fail(ConnectionClosed(f"protocol error: {exc}")) from None
        if isinstance(method, commands.Connection.Close):
            try:
                self._send_method(0, commands.Connection.CloseOk())
            except OSError:
                pass
            raise self._fail(ConnectionClosed(
                f"broker closed the connection: {method.reply_code} {method.reply_text}",
                method.reply_code, method.reply_text))
        if isinstance(method, commands.Channel.Close):
            try:
                self._send_method(channel, commands.Channel.CloseOk())
            except OSError:
                pass
            # the connection is useless to us once its only channel is gone
            exc = ChannelClosed(f"broker closed the channel: {method.reply_code} {method.reply_text}",
                                method.reply_code, method.reply_text)
            self.closed = exc
            raise exc
        if isinstance(method, commands.Basic.Cancel):  # consumer_cancel_notify
            self.cancelled.add(method.consumer_tag)
            return
        if isinstance(method, commands.Basic.Return):     # mandatory publish, unroutable
            self._on_return(method)
            return
        if isinstance(method, (commands.Connection.Blocked, commands.Connection.Unblocked)):
            return
        self._replies.append((channel, method))

    def _expect(self, channel: int, kind, timeout: float | None = 30.0):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for i, (ch, method) in enumerate(self._replies):
                if ch == channel and isinstance(method, kind):
                    del self._replies[i]
                    return method
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise self._fail(ConnectionClosed(f"timed out waiting for {kind.__name__}"))
            self._recv(left)

    def _rpc(self, method, reply_kind, timeout: float | None = 30.0):
        self._check()
        self._send_method(1, method)
        return self._expect(1, reply_kind, timeout)

    def _check(self) -> None:
        if self.closed is not None:
            raise self.closed

    # ------------------------------------------------------------------ API
    def basic_qos(self, prefetch_count: int, global_: bool = False) -> None:
        self._rpc(commands.Basic.Qos(prefetch_count=prefetch_count, global_=global_),
                  commands.Basic.QosOk)

    def basic_consume(self, queue: str, arguments: dict | None = None, no_ack: bool = False,
                      consumer_tag: str = "") -> str:
        ok = self._rpc(commands.Basic.Consume(queue=queue, consumer_tag=consumer_tag, no_ack=no_ack,
                                              arguments=arguments or {}),
                       commands.Basic.ConsumeOk)
        self.consumer_tags.append(ok.consumer_tag)
        return ok.consumer_tag

    def consume_limited(self, queue: str, limit: int, arguments: dict | None = None) -> list[str]:
        """Consume with at most ``limit`` unacked deliveries in total.

        prefetch-count is 16 bits, so limits above 65535 are spread over several consumers
        on the channel (``global=false`` qos is per consumer and applies to new consumers).
        """
        if limit <= 0:
            raise ValueError("limit must be positive")
        tags = []
        left = limit
        while left > 0:
            n = min(left, MAX_PREFETCH)
            self.basic_qos(n)
            tags.append(self.basic_consume(queue, arguments))
            left -= n
        return tags

    def basic_cancel(self, consumer_tag: str, timeout: float = 30.0) -> None:
        """Cancel a consumer; deliveries that arrive before cancel-ok stay queued in this client."""
        if consumer_tag in self.cancelled:
            self.consumer_tags.remove(consumer_tag)
            return
        self._rpc(commands.Basic.Cancel(consumer_tag=consumer_tag), commands.Basic.CancelOk, timeout)
        self.consumer_tags.remove(consumer_tag)

    def cancel_all(self) -> None:
        for tag in list(self.consumer_tags):
            self.basic_cancel(tag)

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self._check()
        self._send(ack_frame(1, delivery_tag, multiple))

    def sync(self, queue: str) -> int:
        """A round trip on the channel (passive queue.declare): every frame sent before it
        (acks in particular) has been processed by the broker when this returns.
        Returns the queue's ready-message count."""
        return self.queue_declare(queue, passive=True)[1]

    def pending(self) -> int:
        return (len(self._deliveries) - self._dpos) // STRIDE

    def _wait_for(self, max_n: int, timeout: float | None) -> None:
        """Read until ``max_n`` deliveries are pending, or (once some are) until the socket has
        nothing more right now, or ``timeout`` s passed without any."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.pending() < max_n:
            if self.pending() == 0:
                self._raise_if_cancelled()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                if not self._recv(left):
                    continue
            else:
                if not self._recv(0):  # drain what is already buffered, don't wait
                    break

    def take(self, max_n: int, timeout: float | None) -> list[Delivery]:
        """Up to ``max_n`` deliveries.  Waits at most ``timeout`` s for the first one; once some
        are available, returns what has arrived (reading whatever is already in the socket)."""
        return self.take_batch(max_n, timeout).rows()

    def take_batch(self, max_n: int, timeout: float | None) -> DeliveryBatch:
        """``take`` as columns (``DeliveryBatch``): the readers' hot path."""
        self._wait_for(max_n, timeout)
        return self._pop(max_n)

    def take_exactly(self, n: int, idle_timeout: float) -> list[Delivery]:
        """Collect ``n`` deliveries, or fewer if none arrives for ``idle_timeout`` s."""
        return self.take_batch_exactly(n, idle_timeout).rows()

    def take_batch_exactly(self, n: int, idle_timeout: float) -> DeliveryBatch:
        """``take_exactly`` as columns."""
        out = DeliveryBatch()
        while len(out) < n:
            got = self.take_batch(n - len(out), idle_timeout)
            if not got:
                break
            out.extend(got)
        return out

    def _pop(self, max_n: int) -> DeliveryBatch:
        start = self._dpos
        flat = self._deliveries
        stop = min(len(flat), start + max_n * STRIDE)
        if start == 0 and stop >= len(flat):
            self._deliveries = []
            return DeliveryBatch(flat)
        out = flat[start:stop]
        if stop >= len(flat):
            self._deliveries = []
            self._dpos = 0
        else:
            self._dpos = stop
            if stop > 65536 * STRIDE:
                del flat[:stop]
                self._dpos = 0
        return DeliveryBatch(out)

    def _raise_if_cancelled(self) -> None:
        live = [t for t in self.consumer_tags if t not in self.cancelled]
        if self.consumer_tags and not live:
            raise ConsumerCancelled("the broker cancelled the consumer (queue deleted?)")

    # ------------------------------------------------------------------ teardown
    def close(self, timeout: float = 5.0) -> None:
        """Graceful close.  Never nacks: unacked deliveries are requeued by the broker."""
        if self._sock is None:
            return
        if self.closed is None:
            try:
                self._send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye",
                                                                 class_id=0, method_id=0))
                deadline = time.monotonic() + timeout
                while True:
                    if any(isinstance(m, commands.Connection.CloseOk) for _, m in self._replies):
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._recv(left)
            except (AMQPError, OSError, ValueError, TypeError):
                pass
        self._drop()

    def abort(self) -> None:
        """Drop the TCP connection at once (the broker requeues every unacked delivery)."""
        self._drop()

    def _drop(self) -> None:
        self._hb_stop.set()
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
        if self.closed is None:
            self.closed = ConnectionClosed("connection is closed")

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
