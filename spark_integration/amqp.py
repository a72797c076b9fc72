"""A small blocking AMQP 0-9-1 client for the Spark reader and ``drain``.

Why not pika: the reader needs exact control over what happens to unacked
deliveries.  ``pika.BlockingChannel.close()``/``basic_cancel()`` nack every
delivery it has buffered but not yet handed out, which (a) is not what
"requeue by closing the channel" means for a classic queue and (b) is a
connection error (540) on a stream queue, where nack is not supported.  This
client never nacks: unacked deliveries go back to the queue when the channel
or connection closes, exactly as the AMQP spec says.

Scope: one connection, one channel (channel 1), PLAIN auth, optional TLS,
heartbeats (a background thread keeps the connection alive while the caller
is busy, e.g. during a long Spark write with deliveries held unacked),
queue.declare, basic.qos/consume/cancel/ack, publish (+ confirms).

Hot path: basic.deliver / content header / content body frames are parsed with
``struct`` straight out of the receive buffer; everything else goes through
pamqp (a dependency of the broker project).
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import threading
import time
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

from pamqp import commands, frame as pframe, header as pheader
from pamqp import decode as pdecode

__all__ = [
    "AMQPError", "ConnectionFailed", "ChannelClosed", "ConnectionClosed", "ConsumerCancelled",
    "ConnectionParams", "Properties", "Delivery", "Connection", "MAX_PREFETCH",
]

FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
MAX_PREFETCH = 65535  # basic.qos prefetch-count is a short
SEND_TIMEOUT = 120.0  # a broker that takes nothing for this long is treated as dead

_HDR = struct.Struct(">BHI")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_TAG_BIT = struct.Struct(">QB")
_CONTENT_HDR = struct.Struct(">HHQH")
_ACK = struct.Struct(">BHIHHQBB")
_HEARTBEAT = bytes((FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END))

_M_DELIVER = (60 << 16) | 60
_M_ACK = (60 << 16) | 80
_M_NACK = (60 << 16) | 120


class AMQPError(Exception):
    """Base class; ``code``/``text`` carry the broker's reply code and text when there is one."""

    def __init__(self, message: str, code: int = 0, text: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.text = text


class ConnectionFailed(AMQPError):
    """Could not reach / log in to the broker."""


class ChannelClosed(AMQPError):
    """The broker closed the channel (e.g. 404 NOT_FOUND, 406 PRECONDITION_FAILED)."""


class ConnectionClosed(AMQPError):
    """The broker closed the connection, or the socket died."""


class ConsumerCancelled(AMQPError):
    """The broker cancelled our consumer (queue deleted, failover...)."""


class ConnectionParams(NamedTuple):
    host: str = "127.0.0.1"
    port: int = 5672
    vhost: str = "/"
    username: str = "guest"
    password: str = "guest"
    tls: bool = False
    heartbeat: int = 60
    connect_timeout: float = 10.0

    @classmethod
    def from_url(cls, url: str) -> "ConnectionParams":
        """Parse ``amqp[s]://user:pass@host:port/vhost?heartbeat=N&connection_timeout=S``.

        An absent or empty path means the default vhost ``/`` (``%2F`` also works).
        """
        if not isinstance(url, str) or not url:
            raise ValueError("AMQP url is empty; expected amqp://user:pass@host:port/vhost")
        parts = urlsplit(url)
        if parts.scheme not in ("amqp", "amqps"):
            raise ValueError(f"AMQP url must start with amqp:// or amqps://, got {url!r}")
        tls = parts.scheme == "amqps"
        try:
            port = parts.port or (5671 if tls else 5672)
        except ValueError as exc:
            raise ValueError(f"bad port in AMQP url {url!r}: {exc}") from None
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        vhost = unquote(path) if path else "/"
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            heartbeat = int(query.get("heartbeat", 60))
            timeout = float(query.get("connection_timeout", query.get("connect_timeout", 10)))
        except ValueError as exc:
            raise ValueError(f"bad query parameter in AMQP url {url!r}: {exc}") from None
        return cls(host=parts.hostname or "127.0.0.1", port=port, vhost=vhost,
                   username=unquote(parts.username) if parts.username is not None else "guest",
                   password=unquote(parts.password) if parts.password is not None else "guest",
                   tls=tls, heartbeat=heartbeat, connect_timeout=timeout)

    def redacted(self) -> str:
        scheme = "amqps" if self.tls else "amqp"
        return f"{scheme}://{self.username}@{self.host}:{self.port}/{self.vhost}"


class Properties(NamedTuple):
    """basic properties, decoded; absent ones are None.  ``timestamp`` is seconds since the epoch."""
    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


EMPTY_PROPERTIES = Properties()


class Delivery(NamedTuple):
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: Properties
    body: bytes
    consumer_tag: str


# property flag bit -> (field index, kind); kinds: s=shortstr, t=table, o=octet, q=u64 timestamp
_PROP_LAYOUT = ((15, "s"), (14, "s"), (13, "t"), (12, "o"), (11, "o"), (10, "s"), (9, "s"),
                (8, "s"), (7, "s"), (6, "q"), (5, "s"), (4, "s"), (3, "s"), (2, "s"))


def _shortstr(buf, pos: int) -> tuple[str, int]:
    n = buf[pos]
    return bytes(buf[pos + 1:pos + 1 + n]).decode("utf-8", "replace"), pos + 1 + n


def decode_properties(buf, pos: int, flags: int) -> Properties:
    """Decode the property list of a content header (``flags`` = first property-flags word)."""
    values: list[Any] = [None] * 14
    if flags & 1:  # continuation flags: skip the extra words (no basic property uses them)
        while True:
            (more,) = _U16.unpack_from(buf, pos)
            pos += 2
            if not more & 1:
                break
    for i, (bit, kind) in enumerate(_PROP_LAYOUT):
        if not flags & (1 << bit):
            continue
        if kind == "s":
            values[i], pos = _shortstr(buf, pos)
        elif kind == "o":
            values[i] = buf[pos]
            pos += 1
        elif kind == "q":
            (values[i],) = _U64.unpack_from(buf, pos)
            pos += 8
        else:
            (size,) = _U32.unpack_from(buf, pos)
            _, values[i] = pdecode.field_table(bytes(buf[pos:pos + 4 + size]))
            pos += 4 + size
    return Properties(*values)


def encode_properties(props: dict | Properties | None) -> commands.Basic.Properties:
    if props is None:
        return commands.Basic.Properties()
    if isinstance(props, Properties):
        props = {k: v for k, v in props._asdict().items() if v is not None}
    props = dict(props)
    ts = props.get("timestamp")
    if isinstance(ts, (int, float)):
        import datetime as _dt
        props["timestamp"] = _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc)
    if "type" in props:
        props["message_type"] = props.pop("type")
    return commands.Basic.Properties(**props)


class Connection:
    """A blocking connection with one channel.  Not thread-safe (apart from the heartbeat sender)."""

    def __init__(self, params: ConnectionParams, client_name: str = "spark-amqp") -> None:
        self.params = params
        self.client_name = client_name
        self._sock: socket.socket | None = None
        self._buf = bytearray()
        self._deliveries: list[Delivery] = []
        self._dpos = 0                       # index of the next undelivered entry in _deliveries
        # delivery being assembled: [tag, redelivered, exchange, rkey, props, left, chunks, ctag]
        self._partial: list | None = None
        self._replies: list = []             # cold method frames received on channel 1 / 0
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
        # publisher confirms
        self._confirming = False
        self._publish_seq = 0
        self._confirmed = 0
        self._nacked: list[int] = []

    # ------------------------------------------------------------------ setup
    @classmethod
    def connect(cls, url_or_params: str | ConnectionParams, **kw) -> "Connection":
        params = (url_or_params if isinstance(url_or_params, ConnectionParams)
                  else ConnectionParams.from_url(url_or_params))
        conn = cls(params, **kw)
        conn._open()
        return conn

    def _open(self) -> None:
        p = self.params
        where = f"{p.host}:{p.port}"
        try:
            sock = socket.create_connection((p.host, p.port), timeout=p.connect_timeout)
        except OSError as exc:
            raise ConnectionFailed(f"cannot connect to AMQP broker at {where}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if p.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=p.host)
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
        self._send(pheader.ProtocolHeader().marshal())
        start = self._expect(0, commands.Connection.Start, p.connect_timeout)
        self.server_properties = dict(start.server_properties or {})
        mechs = start.mechanisms.split() if isinstance(start.mechanisms, str) else []
        if mechs and "PLAIN" not in mechs:
            raise ConnectionFailed(f"broker offers no PLAIN auth (mechanisms: {start.mechanisms})")
        caps = {"authentication_failure_close": True, "consumer_cancel_notify": True,
                "publisher_confirms": True, "basic.nack": True, "connection.blocked": True}
        self._send_method(0, commands.Connection.StartOk(
            client_properties={"product": self.client_name, "capabilities": caps},
            mechanism="PLAIN", response=f"\0{p.username}\0{p.password}", locale="en_US"))
        tune = self._expect(0, commands.Connection.Tune, p.connect_timeout)
        self.frame_max = min(tune.frame_max or 131072, 131072)
        if not p.heartbeat:          # the client asked for no heartbeats
            self.heartbeat = 0
        elif tune.heartbeat:
            self.heartbeat = min(p.heartbeat, tune.heartbeat)
        else:
            self.heartbeat = p.heartbeat
        channel_max = tune.channel_max or 2047
        self._send_method(0, commands.Connection.TuneOk(channel_max=channel_max,
                                                        frame_max=self.frame_max,
                                                        heartbeat=self.heartbeat))
        self._send_method(0, commands.Connection.Open(virtual_host=p.vhost))
        self._expect(0, commands.Connection.OpenOk, p.connect_timeout)
        self._send_method(1, commands.Channel.Open())
        self._expect(1, commands.Channel.OpenOk, p.connect_timeout)
        if self.heartbeat:
            self._hb_thread = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                               name="amqp-heartbeat")
            self._hb_thread.start()

    def _heartbeat_loop(self) -> None:
        interval = max(self.heartbeat / 2.0, 0.5)
        while not self._hb_stop.wait(interval):
            if time.monotonic() - self._last_send >= interval:
                try:
                    self._send(_HEARTBEAT)
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
        self._send(pframe.marshal(method, channel))

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
            data = sock.recv(262144)
        except (socket.timeout, BlockingIOError, ssl.SSLWantReadError):
            return False
        except OSError as exc:
            raise self._fail(ConnectionClosed(f"connection lost: {exc}")) from None
        if not data:
            raise self._fail(ConnectionClosed("connection closed by the broker (socket EOF)"))
        self._last_recv = time.monotonic()
        self._buf += data
        self._parse()
        return True

    def _parse(self) -> None:
        buf = self._buf
        n = len(buf)
        pos = 0
        unpack_hdr = _HDR.unpack_from
        while n - pos >= 8:
            ftype, channel, size = unpack_hdr(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if buf[end] != FRAME_END:
                raise self._fail(ConnectionClosed("protocol error: bad frame end"))
            start = pos + 7
            if ftype == FRAME_BODY:
                part = self._partial
                if part is not None:     # (content of a basic.return is dropped)
                    chunk = bytes(buf[start:end])
                    part[6].append(chunk)
                    part[5] -= len(chunk)
                    if part[5] <= 0:
                        self._complete()
            elif ftype == FRAME_METHOD:
                if _U32.unpack_from(buf, start)[0] == _M_DELIVER:
                    p = start + 4
                    ctag, p = _shortstr(buf, p)
                    tag, bits = _TAG_BIT.unpack_from(buf, p)
                    p += 9
                    exchange, p = _shortstr(buf, p)
                    rkey, p = _shortstr(buf, p)
                    self._partial = [tag, bool(bits & 1), exchange, rkey, None, 0, [], ctag]
                else:
                    self._on_method(channel, bytes(buf[pos:end + 1]))
            elif ftype == FRAME_HEADER:
                _cls, _w, body_size, flags = _CONTENT_HDR.unpack_from(buf, start)
                part = self._partial
                if part is not None:
                    part[4] = decode_properties(buf, start + 14, flags) if flags else EMPTY_PROPERTIES
                    part[5] = body_size
                    if body_size == 0:
                        self._complete()
            pos = end + 1
        if pos:
            del buf[:pos]

    def _complete(self) -> None:
        tag, redelivered, exchange, rkey, props, _left, chunks, ctag = self._partial
        self._partial = None
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._deliveries.append(Delivery(tag, redelivered, exchange, rkey, props, body, ctag))

    def _on_method(self, channel: int, raw: bytes) -> None:
        cm = _U32.unpack_from(raw, 7)[0]
        if cm == _M_ACK or cm == _M_NACK:   # publisher confirms
            tag, bits = _TAG_BIT.unpack_from(raw, 11)
            if cm == _M_NACK:
                self._nacked.append(tag)
            if bits & 1:
                self._confirmed = max(self._confirmed, tag)
            elif tag == self._confirmed + 1:
                self._confirmed = tag
            else:
                self._confirmed = max(self._confirmed, tag)  # broker confirms in order
            return
        _, _, method = pframe.unmarshal(raw)
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
        if isinstance(method, (commands.Connection.Blocked, commands.Connection.Unblocked,
                               commands.Basic.Return)):
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
    def queue_declare(self, queue: str, passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False,
                      arguments: dict | None = None) -> tuple[str, int, int]:
        """Returns (name, message_count, consumer_count)."""
        ok = self._rpc(commands.Queue.Declare(queue=queue, passive=passive, durable=durable,
                                              exclusive=exclusive, auto_delete=auto_delete,
                                              arguments=arguments or {}),
                       commands.Queue.DeclareOk)
        return ok.queue, ok.message_count, ok.consumer_count

    def queue_delete(self, queue: str) -> int:
        return self._rpc(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk).message_count

    def queue_purge(self, queue: str) -> int:
        return self._rpc(commands.Queue.Purge(queue=queue), commands.Queue.PurgeOk).message_count

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
        self._send(_ACK.pack(FRAME_METHOD, 1, 13, 60, 80, delivery_tag, 1 if multiple else 0,
                             FRAME_END))

    def sync(self, queue: str) -> int:
        """A round trip on the channel (passive queue.declare): every frame sent before it
        (acks in particular) has been processed by the broker when this returns.
        Returns the queue's ready-message count."""
        return self.queue_declare(queue, passive=True)[1]

    def pending(self) -> int:
        return len(self._deliveries) - self._dpos

    def take(self, max_n: int, timeout: float | None) -> list[Delivery]:
        """Up to ``max_n`` deliveries.  Waits at most ``timeout`` s for the first one; once some
        are available, returns what has arrived (reading whatever is already in the socket)."""
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
        return self._pop(max_n)

    def take_exactly(self, n: int, idle_timeout: float) -> list[Delivery]:
        """Collect ``n`` deliveries, or fewer if none arrives for ``idle_timeout`` s."""
        out: list[Delivery] = []
        while len(out) < n:
            got = self.take(n - len(out), idle_timeout)
            if not got:
                break
            out.extend(got)
        return out

    def _pop(self, max_n: int) -> list[Delivery]:
        start = self._dpos
        stop = min(len(self._deliveries), start + max_n)
        out = self._deliveries[start:stop]
        if stop >= len(self._deliveries):
            self._deliveries = []
            self._dpos = 0
        else:
            self._dpos = stop
            if stop > 65536:
                del self._deliveries[:stop]
                self._dpos = 0
        return out

    def _raise_if_cancelled(self) -> None:
        live = [t for t in self.consumer_tags if t not in self.cancelled]
        if self.consumer_tags and not live:
            raise ConsumerCancelled("the broker cancelled the consumer (queue deleted?)")

    # ------------------------------------------------------------------ publishing
    def confirm_select(self) -> None:
        self._rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        self._confirming = True

    def publish_frames(self, exchange: str, routing_key: str, body: bytes,
                       properties: dict | Properties | None = None, mandatory: bool = False) -> bytes:
        """Encode one basic.publish (method + header + body frames)."""
        method = pframe.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                       mandatory=mandatory), 1)
        head = pframe.marshal(pheader.ContentHeader(0, len(body), encode_properties(properties)), 1)
        parts = [method, head]
        step = self.frame_max - 8
        for i in range(0, len(body), step):
            piece = body[i:i + step]
            parts.append(_HDR.pack(FRAME_BODY, 1, len(piece)) + piece + b"\xce")
        return b"".join(parts)

    def publish(self, exchange: str, routing_key: str, body: bytes,
                properties: dict | Properties | None = None, mandatory: bool = False) -> None:
        self.publish_raw(self.publish_frames(exchange, routing_key, body, properties, mandatory))

    def publish_raw(self, frames: bytes, count: int = 1) -> None:
        """Send pre-encoded publishes (``count`` of them, for confirm accounting)."""
        self._check()
        self._send(frames)
        self._publish_seq += count
        if self._confirming and self._sock is not None:
            # keep the receive side moving so the broker never blocks on our socket buffer
            while self._recv(0):
                pass

    def wait_for_confirms(self, timeout: float = 60.0, max_outstanding: int = 0) -> None:
        """Wait until at most ``max_outstanding`` publishes are unconfirmed; raise on nacks."""
        deadline = time.monotonic() + timeout
        while self._publish_seq - self._confirmed > max_outstanding:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AMQPError(f"timed out waiting for publisher confirms "
                                f"({self._publish_seq - self._confirmed} outstanding)")
            self._recv(left)
        if self._nacked:
            raise AMQPError(f"broker nacked {len(self._nacked)} publishes")

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
