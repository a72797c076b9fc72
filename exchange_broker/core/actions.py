"""What a queue type asks of the connection that publishes into it, returned from ``enqueue``.

As in RabbitMQ's queue type interface (``rabbit_queue_type``), a queue takes commands and answers
with actions that the caller (the channel, the MQTT session) applies; a queue never calls up into
a connection. ``enqueue`` returns one of

* None: nothing to do (the fast path: a message that needs no confirm to wait for),
* a :class:`~exchange_broker.core.ports.Waiter`: reply later (the confirm waits for the store or
  for another node),
* a :class:`Block`: stop reading the publisher (RabbitMQ's ``{block, QueueName}``), with whatever
  else the publish returned; a *paced* Block stops it only if the connection may be paced (it
  consumes nothing and pacing is on: the connection knows, ``BackPressure.may_pace``).

The matching release (``{unblock, QueueName}``) comes later, when the queue has drained, as the
event ``Connection.unthrottle(queue)`` to each connection it holds (``QueueType.release_publishers``).
"""

from __future__ import annotations

from exchange_broker.core.ports import Waiter


class Block:
    """Pause reading the publisher until ``queue`` releases it. ``then``: the rest of the answer
    (the message's durability waiter, another Block, or None). ``paced``: only if the publisher
    may be paced (queue_types/pacing.py), else nothing."""

    __slots__ = ("queue", "then", "paced")

    def __init__(self, queue, then=None, paced: bool = False) -> None:
        self.queue = queue
        self.then = then
        self.paced = paced

    def __repr__(self) -> str:
        paced = ", paced" if self.paced else ""
        return f"Block({getattr(self.queue, 'name', self.queue)!r}, then={self.then!r}{paced})"


def joined(a, b):
    """Two queues' answers to one publish (routed to both), neither None, as one: the Blocks of
    both, then a waiter that fires once both waiters have (``Waiter.all``)."""
    if a.__class__ is not Block and b.__class__ is not Block:
        return Waiter.all(a, b)
    blocks = []
    waiters = []
    for answer in (a, b):
        while answer.__class__ is Block:
            blocks.append((answer.queue, answer.paced))
            answer = answer.then
        if answer is not None and answer not in waiters:
            waiters.append(answer)
    out = Waiter.all(*waiters) if len(waiters) == 2 else (waiters[0] if waiters else None)
    for q, paced in reversed(blocks):
        out = Block(q, out, paced)
    return out
