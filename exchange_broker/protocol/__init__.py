"""Sans-IO AMQP 0-9-1 protocol layer, the project's one frame codec: bytes in, events out;
frames in, bytes out. Used by the server, the AMQP client (``exchange_broker/client/``), the Spark
package and the benchmarks' load generator.

* ``frames``: frame headers packed and parsed (``frame``, ``frame_at``, ``content_at``), content,
  basic.publish and basic.ack/nack framing, the heartbeat frame;
* ``codec``: any method through pamqp (``method_frame``, ``decode_method``), the server's
  per-message fast paths (``deliver_frames``, ``decode_publish`` ...), raw properties;
* ``connection.ServerConnection`` and ``client.ClientConnection`` (+ ``deliveries``): the two
  sides of a connection, ``receive_data(bytes)`` -> events, ``data_to_send()`` -> bytes.

Nothing in this package imports asyncio or touches sockets or the database.
"""
