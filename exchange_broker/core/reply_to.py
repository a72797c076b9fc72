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
        ch.reply_tag_sh = codec.short_str(ch.reply_tag)
        ch.reply_token = generated("")
        self.channels[ch.reply_token] = ch
        return ch.reply_tag

    def cancel(self, ch) -> None:
        if ch.reply_token is not None:
            self.channels.pop(ch.reply_token, None)
        ch.reply_tag = ch.reply_token = None

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

    def deliver(self, msg: Message) -> bool:
        """A reply published to the default exchange with a reply address; False if it is gone."""
        ch = self.channels.get(msg.routing_key[len(PREFIX):])
        if ch is None or ch.closed:
            return False
        ch.deliver_reply(msg)
        return True
