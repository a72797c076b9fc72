"""Direct reply-to (`amq.rabbitmq.reply-to`): RPC replies straight to the requesting channel."""

from __future__ import annotations

from exchange_broker.core.message import Message
from exchange_broker.core.names import generated
from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError

PSEUDO_QUEUE = "amq.rabbitmq.reply-to"
PREFIX = PSEUDO_QUEUE + "."
_MARK = PSEUDO_QUEUE.encode()


class ReplyConsumer:
    """A channel's consumer of its replies, as its delivery routine sees it (no queue, no ack)."""

    __slots__ = ("tag", "tag_sh")
    no_ack = True

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.tag_sh = codec.short_str(tag)


class ReplyTo:
    """Registry of channels consuming from the pseudo-queue, keyed by an unguessable token."""

    def __init__(self) -> None:
        self.channels: dict[str, object] = {}

    def consume(self, ch, tag: str, no_ack: bool) -> str:
        if not no_ack:
            raise AMQPError(PRECONDITION_FAILED, "reply consumer cannot acknowledge", 60, 20, hard=False)
        if ch.reply_tag is not None:
            raise AMQPError(PRECONDITION_FAILED, "reply consumer already set", 60, 20, hard=False)
        ch.reply_tag = tag or generated("amq.ctag-")
        ch.reply_consumer = ReplyConsumer(ch.reply_tag)
        ch.reply_token = generated("")
        self.channels[ch.reply_token] = ch
        return ch.reply_tag

    def cancel(self, ch) -> None:
        if ch.reply_token is not None:
            self.channels.pop(ch.reply_token, None)
        ch.reply_tag = ch.reply_token = ch.reply_consumer = None

    def rewrite_reply_to(self, ch, properties: bytes) -> bytes:
        """A request naming `amq.rabbitmq.reply-to` gets the channel's own reply address."""
        if _MARK not in properties:
            return properties
        props = codec.parse_properties(properties)
        if props.get("reply_to") != PSEUDO_QUEUE:
            return properties
        if ch.reply_token is None:
            raise AMQPError(PRECONDITION_FAILED, "fast reply consumer does not exist", 60, 40, hard=False)
        props["reply_to"] = PREFIX + ch.reply_token
        return codec.encode_properties(props)

    def exists(self, name: str) -> bool:
        """A queue.declare of the pseudo-queue (every one is passive, as in RabbitMQ): the name
        itself always exists, a reply address while its channel consumes."""
        if name == PSEUDO_QUEUE:
            return True
        ch = self.channels.get(name[len(PREFIX):]) if name.startswith(PREFIX) else None
        return ch is not None and not ch.closed

    def deliver(self, msg: Message) -> bool:
        """A reply published to the default exchange with a reply address; False if it is gone."""
        ch = self.channels.get(msg.routing_key[len(PREFIX):])
        if ch is None or ch.closed:
            return False
        ch.deliver_reply(msg)
        return True
