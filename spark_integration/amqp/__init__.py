"""The package's own blocking AMQP 0-9-1 client (see ``connection.py`` for why not pika).

* ``params``: ``ConnectionParams`` from an ``amqp[s]://`` URL (one node or several);
* ``frames``: incoming frames parsed into deliveries (the hot path), kept as columns
  (``batch``: ``DeliveryBatch``);
* ``codec``: properties/deliveries and the ``struct`` encoders and decoders of the hot paths;
* ``connection``: ``Connection``, one channel: consume, ack (+ ``queues``: declare, bind...);
* ``publishing``: publisher confirms, nacks and mandatory returns (mixed into ``Connection``);
* ``errors``: the exceptions.
"""

from .batch import DeliveryBatch
from .codec import EMPTY_PROPERTIES, MAX_PREFETCH, Delivery, Properties, publish_frames
from .connection import Connection
from .errors import (AMQPError, ChannelClosed, ConnectionClosed, ConnectionFailed,
                     ConsumerCancelled, PublishFailed)
from .params import ConnectionParams

__all__ = ["AMQPError", "ConnectionFailed", "ChannelClosed", "ConnectionClosed",
           "ConsumerCancelled", "PublishFailed", "ConnectionParams", "Properties",
           "EMPTY_PROPERTIES", "Delivery", "DeliveryBatch", "Connection", "MAX_PREFETCH", "publish_frames"]
