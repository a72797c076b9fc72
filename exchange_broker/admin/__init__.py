"""Admin HTTP API (RabbitMQ management-API compatible), Prometheus metrics and the admin CLI.

``app`` builds the FastAPI application over a :class:`exchange_broker.service.BrokerService`;
``server`` runs it with uvicorn inside the broker's own event loop.
"""
