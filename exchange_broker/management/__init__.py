"""The admin side: RabbitMQ's management HTTP API, Prometheus metrics and the admin CLI client.

One module per resource, each holding its routes (an APIRouter) and the functions behind them:
vhosts, users, permissions, exchanges, queues, bindings, connections (with channels and
consumers), messages (publish / get), streams (stream offsets), definitions (export / import),
overview (overview, nodes, whoami, aliveness) and metrics (/metrics).

Shared pieces: common (AdminContext, errors, Principal, lookups, permission checks), fields
(JSON <-> AMQP values), stats (counters and rates), web (HTTP glue), paging (list parameters),
auth (HTTP Basic). app.create_app assembles them; server.AdminServer runs the app in the
broker's loop; cli is the HTTP client behind ``exchange-broker admin``.
"""
