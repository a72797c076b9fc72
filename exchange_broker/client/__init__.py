"""An asyncio AMQP 0-9-1 client over the project's sans-IO codec (``exchange_broker.protocol``),
for everything that talks to another broker: cluster links, shovels, federation.

``Connection.open(host, port, user, password, vhost)`` -> ``await conn.channel()`` -> a ``Channel``
(confirm_select, publish -> future, consume, ack/nack/reject, get, call, close); ``on_lost``
callbacks run once when the connection goes.
"""

from exchange_broker.client.channel import Channel
from exchange_broker.client.connection import Connection
from exchange_broker.client.errors import ClientError
from exchange_broker.protocol.deliveries import Delivery

__all__ = ["Channel", "ClientError", "Connection", "Delivery"]
