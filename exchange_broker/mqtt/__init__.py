"""MQTT 3.1, 3.1.1 and 5.0: a sibling of ``connection/`` (AMQP) on the same core. ``codec.py`` and
``properties.py`` turn bytes into packets and back (sans-IO), ``session.py`` maps packets onto the
broker as RabbitMQ's MQTT plugin does (topics are routing keys on ``amq.topic``, a subscription
is a queue bound to it)."""
