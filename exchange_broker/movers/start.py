"""Putting the movers to work in a running broker (the application calls :func:`start_movers`
once the AMQP listener is up, and ``close()`` on what it returns before stopping)."""

from __future__ import annotations

import asyncio
import secrets
import socket

from exchange_broker.movers.amqp import LocalBroker
from exchange_broker.movers.parameters import Parameters

MOVERS_USER = "exchange-broker-movers"  # the internal login of ``amqp://`` (this broker) URIs


def loopback_host(listen_host: str) -> str:
    return "127.0.0.1" if listen_host in ("", "0.0.0.0") else "::1" if listen_host == "::" else listen_host


async def start_movers(broker, store, listen_host: str, port: int, cluster_name: str = "",
                       cluster=None) -> Parameters:
    """The movers' parameters, restored from the store (``store`` None: in memory) and started;
    ``cluster`` (a node with per-queue leaders: ``name``, ``members``) places each on one node.
    ``amqp://`` URIs reach this broker on ``port`` with the movers' internal login (a random
    secret made here; not the cluster links' one: what they publish to a queue another node leads
    must be relayed there, as a client's)."""
    # federation's cycle detection needs a name of its own for each broker
    broker.cluster_name = cluster_name or f"exchange-broker@{socket.gethostname()}:{port}"
    if broker.movers_login is None:
        broker.movers_login = (MOVERS_USER, secrets.token_urlsafe(24))
    user, password = broker.movers_login
    params = Parameters(broker, LocalBroker(loopback_host(listen_host), port, user, password))
    if store is not None:
        from persistence.parameters_store import load_parameters
        rows = await asyncio.get_running_loop().run_in_executor(None, load_parameters, store)
        if cluster is not None:  # per-queue leaders: each mover on one live node
            from exchange_broker.movers.placement import Placement
            params.follow_store(store, Placement(cluster.name, lambda: cluster.members))
        params.restore(rows, broker.vhosts)
    return params
