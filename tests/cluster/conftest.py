"""Fixtures: ``nodes`` starts cluster nodes as real processes on one throwaway PostgreSQL
database (``pg_database``) and kills them all at teardown, printing their logs."""

from __future__ import annotations

import signal
from typing import Callable, Iterator

import pytest
from cluster_support import STEADY_FAILOVER_TIMEOUT, NodeProcess
from pg_pair import PgPair
from tcp_proxy import TcpProxy

from exchange_broker.testing import ThreadedBroker


@pytest.fixture
def cluster_url(pg_database) -> str:
    return pg_database[1]


@pytest.fixture
def migrated_url(pg_database) -> str:
    """A throwaway PostgreSQL database with the newest schema (for the stores' own tests)."""
    from persistence import migrate
    migrate.upgrade(pg_database[1], "head")
    return pg_database[1]


@pytest.fixture
def nodes(workdir, cluster_url, on_priority_worker) -> Iterator[Callable[..., NodeProcess]]:
    """nodes(name, *extra_args, url=None) -> a started NodeProcess (active or standing by), on
    ``cluster_url`` unless ``url`` says another way to it (a proxy, a multi-host URL);
    ``nodes.together(...)`` starts several at once. Outside the cluster group (a test that fails
    no node over) the nodes get ``STEADY_FAILOVER_TIMEOUT`` unless the test gives its own."""
    started: list[NodeProcess] = []
    steady = () if on_priority_worker else ("--cluster-failover-timeout", STEADY_FAILOVER_TIMEOUT)

    def start(name: str, *extra: str, url: str | None = None) -> NodeProcess:
        node = NodeProcess(workdir, url or cluster_url, name, *steady, *extra)
        started.append(node)
        return node.start_node()

    def together(*specs: tuple[str, ...], urls: list[str] | None = None) -> list[NodeProcess]:
        """nodes.together(("n1", *extra), ("n2", *extra), ...) -> those nodes, started at once:
        peers (``--cluster-mode leaders``: they migrate the store one at a time), or standbys of
        an active node that runs already. ``urls``: each node's way to the database, in order
        (a proxy each, a multi-host URL), instead of ``cluster_url``."""
        batch = [NodeProcess(workdir, url, name, *steady, *extra)
                 for (name, *extra), url in zip(specs, urls or [cluster_url] * len(specs))]
        started.extend(batch)
        for node in batch:
            node.launch()
        return [node.ready() for node in batch]

    start.together = together
    try:
        yield start
    finally:
        for node in started:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)  # SIGCONT: a paused node must be able to die
            node.kill()
        for node in started:
            print(f"----- node {node.name} (exit {node.proc.returncode if node.proc else None}) -----")
            for path in sorted(node.workdir.glob(f"node-{node.name}-*.log"))[:-1]:  # earlier runs of it
                print(f"(run {path.name})\n{path.read_text(errors='replace')[-3000:]}")
            print(node.log()[-6000:])


@pytest.fixture
def pg_pair() -> Iterator[PgPair]:
    """A real PostgreSQL primary and streaming standby of this test only (``pg_pair.py``)."""
    pair = PgPair()
    try:
        yield pair.setup()
    finally:
        pair.close()


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[[str, int], TcpProxy]]:
    """tcp_proxy(host, port) -> a started TcpProxy to that address; all closed at teardown."""
    proxies: list[TcpProxy] = []

    def make(host: str, port: int) -> TcpProxy:
        proxy = TcpProxy(host, port).start()
        proxies.append(proxy)
        return proxy

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.close()


@pytest.fixture
def node_b():
    """A second in-process broker built like the ``broker`` fixture: the leader of the queues
    node A (``broker``) holds placeholders for (``remote_support.Cluster``)."""
    with ThreadedBroker() as tb:
        yield tb
