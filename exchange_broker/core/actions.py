"""What a queue type asks of the connection that publishes into it, returned from ``enqueue``.

As in RabbitMQ's queue type interface (``rabbit_queue_type``), a queue takes commands and answers
with actions that the caller (the channel, the MQTT session) applies; a queue never calls up into
a connection. ``enqueue`` returns one of

* None: nothing to do (the fast path: a message that needs no confirm to wait for),
* a :class:`~exchange_broker.core.ports.Waiter`: reply later (the confirm waits for the store or
  for another node),
* a :class:`Block`: stop reading the publisher (RabbitMQ's ``{block, QueueName}``), with whatever
  else the publish returned.

The matching release (``{unblock, QueueName}``) comes later, when the queue has drained, as the
event ``Connection.unthrottle(queue)`` to each connection it holds (``QueueType.release_publishers``).
"""

from __future__ import annotations

from exchange_broker.core.ports import Waiter


class Block:
    """Pause reading the publisher until ``queue`` releases it. ``then``: the rest of the answer
    (the message's durability waiter, another Block, or None)."""

    __slots__ = ("queue", "then")

    def __init__(self, queue, then=None) -> None:
        self.queue = queue
        self.then = then

    def __repr__(self) -> str:
        return f"Block({getattr(self.queue, 'name', self.queue)!r}, then={self.then!r})"


def joined(a, b):
    """Two queues' answers to one publish (routed to both), neither None, as one: the Blocks of
    both, then a waiter that fires once both waiters have (``Waiter.all``)."""
    if a.__class__ is not Block and b.__class__ is not Block:
        return Waiter.all(a, b)
    queues = []
    waiters = []
    for answer in (a, b):
        while answer.__class__ is Block:
            queues.append(answer.queue)
            answer = answer.then
        if answer is not None and answer not in waiters:
            waiters.append(answer)
    out = Waiter.all(*waiters) if len(waiters) == 2 else (waiters[0] if waiters else None)
    for q in reversed(queues):
        out = Block(q, out)
    return out
