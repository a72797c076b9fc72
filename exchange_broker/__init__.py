"""exchange-broker: a RabbitMQ-compatible AMQP 0-9-1 broker."""

__version__ = "0.1.0"
