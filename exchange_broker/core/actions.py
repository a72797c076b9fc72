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


class Block:
    """Pause reading the publisher until ``queue`` releases it. ``then``: the rest of the answer
    (the message's durability waiter, another Block, or None)."""

    __slots__ = ("queue", "then")

    def __init__(self, queue, then=None) -> None:
        self.queue = queue
        self.then = then

    def __repr__(self) -> str:
        return f"Block({getattr(self.queue, 'name', self.queue)!r}, then={self.then!r})"


def waiter_of(result):
    """The durability waiter (or None) in an ``enqueue`` answer, without its actions."""
    while result.__class__ is Block:
        result = result.then
    return result


def joined(answers: list, waiter):
    """One answer from several queues' (a publish routed to more than one): their Blocks, then
    ``waiter``, the publish's combined durability waiter."""
    queues = []
    for answer in answers:
        while answer.__class__ is Block:
            queues.append(answer.queue)
            answer = answer.then
    for q in reversed(queues):
        waiter = Block(q, waiter)
    return waiter
