"""Publishing on the client's channel: publisher confirms, nacks and ``mandatory`` returns.

A mixin of ``Connection`` (it uses the connection's ``_send``/``_recv``/``_rpc``), kept apart so
the consuming side and the publishing side each read on their own.

Confirms: after ``confirm_select()`` every publish gets a sequence number; the broker acks
(or nacks) them in order, possibly several at once (``multiple``).  A ``mandatory`` publish
that no queue takes comes back as ``basic.return`` before its ack.  ``wait_for_confirms``
raises ``PublishFailed`` when anything was nacked or returned since the last check.
"""

from __future__ import annotations

import time

from pamqp import commands

from .codec import Properties, publish_frames
from .errors import AMQPError, PublishFailed

__all__ = ["Publishing"]


class Publishing:
    """Publisher state and methods; ``Connection`` calls ``_init_publishing`` in its __init__."""

    def _init_publishing(self) -> None:
        self._confirming = False
        self._publish_seq = 0       # sequence number of the last publish sent
        self._confirmed = 0         # every publish up to this one is confirmed (acked or nacked)
        self._nacked = 0            # publishes nacked (not yet reported)
        self._returned: list[tuple[int, str, str, str]] = []  # code, text, exchange, routing key
        self.published = 0          # totals, for statistics
        self.nacked_total = 0
        self.returned_total = 0

    # ------------------------------------------------------------------ incoming
    def _on_confirm(self, nack: bool, tag: int, multiple: bool) -> None:
        if nack:
            n = (tag - self._confirmed) if multiple else 1
            self._nacked += max(n, 1)
            self.nacked_total += max(n, 1)
        if multiple or tag > self._confirmed:
            self._confirmed = max(self._confirmed, tag)   # the broker confirms in order

    def _on_return(self, method) -> None:
        self._returned.append((method.reply_code, method.reply_text, method.exchange,
                               method.routing_key))
        self.returned_total += 1

    # ------------------------------------------------------------------ API
    def confirm_select(self) -> None:
        self._rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        self._confirming = True

    def publish_frames(self, exchange: str, routing_key: str, body: bytes,
                       properties: dict | Properties | None = None, mandatory: bool = False) -> bytes:
        """Encode one basic.publish (method + header + body frames) for this connection."""
        if isinstance(properties, Properties):
            properties = properties._asdict()
        return publish_frames(exchange, routing_key, body, properties, mandatory, self.frame_max)

    def publish(self, exchange: str, routing_key: str, body: bytes,
                properties: dict | Properties | None = None, mandatory: bool = False) -> None:
        self.publish_raw(self.publish_frames(exchange, routing_key, body, properties, mandatory))

    def publish_raw(self, frames: bytes, count: int = 1) -> None:
        """Send pre-encoded publishes (``count`` of them, for confirm accounting)."""
        self._check()
        self._send(frames)
        self._publish_seq += count
        self.published += count
        if self._confirming and self._sock is not None:
            # keep the receive side moving so the broker never blocks on our socket buffer
            while self._recv(0):
                pass

    def unconfirmed(self) -> int:
        return self._publish_seq - self._confirmed

    def wait_for_confirms(self, timeout: float = 60.0, max_outstanding: int = 0) -> None:
        """Wait until at most ``max_outstanding`` publishes are unconfirmed.

        Raises ``PublishFailed`` if the broker nacked or returned any publish since the last
        call (the failures are reported once)."""
        deadline = time.monotonic() + timeout
        while self._publish_seq - self._confirmed > max_outstanding:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AMQPError(f"timed out waiting for publisher confirms "
                                f"({self._publish_seq - self._confirmed} outstanding)")
            self._recv(left)
        self.raise_publish_failures()

    def raise_publish_failures(self) -> None:
        nacked, returned = self._nacked, self._returned
        if not nacked and not returned:
            return
        self._nacked, self._returned = 0, []
        parts = []
        if nacked:
            parts.append(f"the broker nacked {nacked} publish(es)")
        if returned:
            code, text, exchange, rkey = returned[0]
            parts.append(f"{len(returned)} mandatory publish(es) returned as unroutable (first: "
                         f"{code} {text}, exchange '{exchange}', routing key '{rkey}')")
            raise PublishFailed("; ".join(parts), code, text)
        raise PublishFailed("; ".join(parts))
