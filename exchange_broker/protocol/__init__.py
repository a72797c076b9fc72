"""Sans-IO AMQP 0-9-1 protocol layer: bytes in, events out; frames in, bytes out.

Nothing in this package imports asyncio or touches sockets or the database.
"""
