"""Old names of the AMQP client, kept while code written against them (shovels) moves to
``exchange_broker.client``: ``Link`` is :class:`~exchange_broker.client.Connection`, ``LinkChannel``
:class:`~exchange_broker.client.Channel`, ``LinkError`` :class:`~exchange_broker.client.ClientError`.
New code imports ``exchange_broker.client``."""

from exchange_broker.client import Channel as LinkChannel
from exchange_broker.client import ClientError as LinkError
from exchange_broker.client import Connection as Link
from exchange_broker.client import Delivery

__all__ = ["Delivery", "Link", "LinkChannel", "LinkError"]
