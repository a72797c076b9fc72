"""The consumer timeout of a channel (part of :class:`~exchange_broker.connection.channel.Channel`).

A delivery unacknowledged for longer than the consumer timeout (``x-consumer-timeout`` on the
queue or its ``consumer-timeout`` policy, else ``serve --consumer-timeout``):

* from a quorum queue, to a client that announced the ``consumer_cancel_notify`` capability: as
  RabbitMQ 4.3 (rabbit_fifo's ``evaluate_consumer_timeout`` and the channel's ``released ...
  timeout`` action), the timed-out deliveries return to the queue for other consumers, and the
  consumer is cancelled with ``basic.cancel`` (nowait); the channel stays open. A late ack, nack or
  reject of a returned delivery is ignored, as RabbitMQ ignores a settlement of a message the
  consumer no longer holds.
* otherwise (classic queues, clients without the capability): the channel is closed with 406
  PRECONDITION_FAILED, as RabbitMQ 3.13 does. (RabbitMQ 4.3 dropped the channel's consumer timeout
  for classic queues altogether; it is kept here.)
"""
from __future__ import annotations

from pamqp import commands

from exchange_broker.core.queue import CANCEL_ON_TIMEOUT
from exchange_broker.protocol.constants import PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError

MAX_CHECKED = 64  # deliveries looked at per check (the oldest: they are in delivery order)


class ConsumerTimeoutMethods:
    def _timeouts_init(self) -> None:
        self.released: set[int] = set()   # delivery tags returned by a consumer timeout

    def timed_out(self, now: float, default_ms: int) -> AMQPError | None:
        """The 406 to close this channel with, when a delivery waited too long for its ack (None:
        nothing timed out, or the consumers that timed out were cancelled)."""
        cancel_notify = self.session.conn.capabilities.get("consumer_cancel_notify")
        expired: dict = {}   # consumer -> its timed-out delivery tags
        for n, (tag, (msg, consumer)) in enumerate(self.unacked.items()):
            if n >= MAX_CHECKED:
                break
            q = msg.queue
            timeout = (q.options.consumer_timeout if q is not None else None) or default_ms
            if timeout and msg.delivered_at is not None and now - msg.delivered_at > timeout / 1000.0:
                if not (cancel_notify and consumer is not None and q is not None
                        and CANCEL_ON_TIMEOUT in q.capabilities()):
                    return AMQPError(PRECONDITION_FAILED, f"delivery acknowledgement on channel "
                                     f"{self.number} timed out. Timeout value used: {timeout} ms. This "
                                     f"timeout value can be configured, see consumers doc guide to learn "
                                     f"more", hard=False)
                expired.setdefault(consumer, []).append(tag)
        for consumer, tags in expired.items():
            self._release(consumer, tags)
        return None

    def _release(self, consumer, tags: list[int]) -> None:
        """Cancel ``consumer`` (basic.cancel to the client) and return its timed-out deliveries."""
        if self.consumers.get(consumer.tag) is consumer:
            self.cancel(consumer.tag)
            self.session.conn.send_method(self.number, commands.Basic.Cancel(consumer.tag, nowait=True))
            self.session.mark_dirty()
        entries = [self.unacked.pop(tag) for tag in tags]
        self.released.update(tags)
        self._settle(entries, 1, True)

    def _forget_released(self, delivery_tag: int, multiple: bool) -> int | None:
        """An ack/nack/reject naming a delivery a consumer timeout returned (RabbitMQ ignores its
        settlement): the tag to settle instead (``multiple``: the newest outstanding one below it),
        or None when nothing is left to settle."""
        if multiple:
            if delivery_tag == 0:
                self.released.clear()
                return 0
            named = delivery_tag in self.released
            self.released = {t for t in self.released if t > delivery_tag}
            if not named or delivery_tag in self.unacked:
                return delivery_tag
            below = [t for t in self.unacked if t < delivery_tag]
            return below[-1] if below else None
        if delivery_tag in self.released:
            self.released.discard(delivery_tag)
            return None
        return delivery_tag
