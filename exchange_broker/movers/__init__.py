"""Background movers: shovels and federation links, owned by one supervisor (``supervisor.py``).

A mover runs on this node, reconnects with its delay after a failure and reports a state
(starting / running / terminated, with the reason). Movers talk to other brokers (or to this one,
over loopback) through the AMQP client imported in ``amqp.py`` only.
"""
