"""Shared definitions (issue 13, step 1 of the plan in /work/notes/cluster.md), on a throwaway
PostgreSQL database with real node processes:

* definitions declared on the active node (exchange, queue, binding, user, permission, policy,
  vhost limit) reach a standby (its definitions version in ``cluster status --json``) and a
  mirror broker following the store (its state, compared object by object), and deletions too;
* the standby takes over with them;
* queue ids reserved by several processes at once never collide;
* several processes seeding an empty store at once write exactly one ``guest``.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import urllib.parse

import pika
import pytest
import requests
from cluster_support import cluster_status, wait_for_status

from eb_support import REPO, pika_connect, subprocess_env, wait_until
from exchange_broker.assembly import make_broker
from exchange_broker.cluster.definitions import BUILTIN, DefinitionsMirror
from persistence.cluster_store import ClusterStore
from persistence.sql_store import SqlStore

VHOST = urllib.parse.quote("/", safe="")


def admin(node, method: str, path: str, body: dict | None = None) -> None:
    r = requests.request(method, f"http://127.0.0.1:{node.admin_port}/api/{path}", json=body,
                         auth=("guest", "guest"), timeout=10)
    assert r.status_code in (200, 201, 204), (method, path, r.status_code, r.text)


def snapshot(broker) -> dict:
    """What a broker's definitions are, as plain values (read on its loop)."""
    out: dict = {"vhosts": set(broker.vhosts), "users": set(broker.users), "permissions": dict(broker.permissions),
                 "exchanges": set(), "queues": {}, "bindings": set(), "policies": set(),
                 "vhost_limits": {k: dict(v) for k, v in broker.vhost_limits.items()}}
    for vh in broker.vhosts.values():
        out["exchanges"] |= {(vh.name, n, ex.type) for n, ex in vh.exchanges.items() if n not in BUILTIN}
        out["queues"].update({(vh.name, n): q.store_id for n, q in vh.queues.items()})
        out["bindings"] |= {(vh.name, s, t, d, rk) for s, t, d, rk, _a in vh.bindings()}
        out["policies"] |= {(vh.name, kind, n) for kind, table in vh.policies.tables.items() for n in table}
    return out


class Mirror:
    """A DefinitionsMirror on its own event loop in a thread (as a node runs one)."""

    def __init__(self, url: str) -> None:
        self.store = SqlStore(url)
        self.store.open(migrate_schema=False)
        self.cluster_store = ClusterStore(url)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.broker = self.call(make_broker)
        self.mirror = DefinitionsMirror(self.cluster_store, self.store, self.broker)
        asyncio.run_coroutine_threadsafe(self.mirror.start(), self.loop).result(30)

    def call(self, fn, *args):
        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def state(self) -> dict:
        return self.call(snapshot, self.broker)

    def wait_for(self, predicate) -> dict | None:
        """The mirror's state once ``predicate(state)`` holds (None if it never did)."""
        return wait_until(lambda: (lambda s: s if predicate(s) else None)(self.state()), timeout=10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.mirror.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        self.store.close()
        self.cluster_store.close()


def store_version(url: str) -> int:
    store = ClusterStore(url)
    try:
        return store.definitions_version()
    finally:
        store.close()


def declare_definitions(n1) -> None:
    conn = pika_connect(n1.port)
    try:
        ch = conn.channel()
        ch.exchange_declare("orders", "topic", durable=True)
        ch.queue_declare("invoices", durable=True, arguments={"x-max-length": 100})
        ch.queue_bind("invoices", "orders", "eu.#")
        ch.exchange_declare("scratch", "fanout", durable=False)  # transient: never in the store
    finally:
        conn.close()
    admin(n1, "PUT", "users/alice", {"password": "s3cret", "tags": "monitoring"})
    admin(n1, "PUT", f"permissions/{VHOST}/alice", {"configure": "", "write": "orders", "read": ".*"})
    admin(n1, "PUT", f"policies/{VHOST}/cap", {"pattern": "^inv", "definition": {"max-length": 10},
                                               "apply-to": "queues"})
    admin(n1, "PUT", f"vhost-limits/{VHOST}/max-queues", {"value": 50})


def test_definitions_reach_a_standby_and_a_mirror_and_the_standby_takes_over_with_them(nodes, cluster_url):
    n1 = nodes("n1")
    n2 = nodes("n2")
    assert n1.is_active() and not n2.is_active()
    mirror = Mirror(cluster_url)
    try:
        before = store_version(cluster_url)
        declare_definitions(n1)
        after = store_version(cluster_url)
        assert after > before  # every definition write bumped the version

        # the standby has loaded them: `cluster status` shows its definitions version
        seen = wait_for_status(cluster_url, lambda ns: ns["n2"]["definitions_version"] >= after)
        assert seen["n2"]["definitions_version"] >= after, seen["n2"]
        assert cluster_status(cluster_url)["n2"]["definitions_version"] >= after

        # a mirror broker holds them, object by object
        state = mirror.wait_for(lambda s: "alice" in s["users"] and s["policies"] and s["vhost_limits"])
        assert state, mirror.state()
        assert ("/", "orders", "topic") in state["exchanges"]
        assert not any(x[1] == "scratch" for x in state["exchanges"])
        assert ("/", "invoices") in state["queues"] and state["queues"][("/", "invoices")] > 0
        assert ("/", "orders", "queue", "invoices", "eu.#") in state["bindings"]
        assert state["permissions"][("alice", "/")] == ("", "orders", ".*")
        assert ("/", "policy", "cap") in state["policies"]
        assert state["vhost_limits"] == {"/": {"max-queues": 50}}
        assert mirror.mirror.version >= after

        # deletions reach it too
        conn = pika_connect(n1.port)
        try:
            ch = conn.channel()
            ch.queue_unbind("invoices", "orders", "eu.#")
            ch.exchange_delete("orders")
        finally:
            conn.close()
        admin(n1, "DELETE", f"policies/{VHOST}/cap")
        admin(n1, "DELETE", "users/alice")
        gone = mirror.wait_for(lambda s: "alice" not in s["users"] and not s["policies"]
                               and not any(x[1] == "orders" for x in s["exchanges"]))
        assert gone, mirror.state()
        assert not gone["bindings"] and ("alice", "/") not in gone["permissions"]
        assert ("/", "invoices") in gone["queues"]
        last = store_version(cluster_url)
        seen = wait_for_status(cluster_url, lambda ns: min(n["definitions_version"] for n in ns.values()) >= last)
        assert seen["n2"]["definitions_version"] >= last
        assert seen["n1"]["definitions_version"] >= last  # the active node: the store's version, each beat
        table = subprocess.run([sys.executable, "-m", "exchange_broker", "cluster", "status", "--database-url",
                                cluster_url], capture_output=True, text=True, timeout=60, cwd=str(REPO),
                               env=subprocess_env())
        assert table.returncode == 0 and "definitions" in table.stdout.splitlines()[0], table.stdout
        assert f"v{seen['n2']['definitions_version']}" in table.stdout or f"v{last}" in table.stdout
        api = requests.get(f"http://127.0.0.1:{n1.admin_port}/api/nodes", auth=("guest", "guest"), timeout=10)
        assert {n["name"]: n["definitions_version"] >= last for n in api.json()} == {"n1": True, "n2": True}
    finally:
        mirror.close()

    # the standby takes over with the definitions (and keeps them)
    n1.proc.send_signal(signal.SIGTERM)
    assert n1.proc.wait(30) == 0
    assert wait_until(n2.is_active, timeout=30), n2.log()[-3000:]
    assert "serving the definitions followed as a standby" in n2.log()  # its warm broker
    conn = pika_connect(n2.port)
    try:
        ch = conn.channel()
        ch.queue_declare("invoices", durable=True, passive=True, arguments={"x-max-length": 100})
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.exchange_declare("orders", "topic", passive=True)
        assert refused.value.reply_code == 404
    finally:
        conn.close()


RESERVE = """
import sys
from persistence.sql_store import SqlStore
store = SqlStore(sys.argv[1]); store.open(migrate_schema=False)
ids = []
for _ in range(20):
    ids += store.reserve_queue_ids(64)
print(" ".join(map(str, ids)))
store.close()
"""


def test_queue_ids_from_several_processes_never_collide(pg_database):
    url = pg_database[1]
    SqlStore(url).open()  # migrate once
    procs = [subprocess.Popen([sys.executable, "-c", RESERVE, url], stdout=subprocess.PIPE, text=True,
                              cwd=str(REPO), env=subprocess_env()) for _ in range(3)]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    ids = [int(x) for out in outs for x in out]
    assert len(ids) == 3 * 20 * 64
    assert len(set(ids)) == len(ids)


def test_a_node_after_another_allocates_new_queue_ids(nodes, cluster_url):
    """Two nodes in turn (a takeover) declare queues: their store ids never collide."""
    n1 = nodes("n1")
    n2 = nodes("n2")
    conn = pika_connect(n1.port)
    try:
        ch = conn.channel()
        for i in range(5):
            ch.queue_declare(f"a{i}", durable=True)
    finally:
        conn.close()
    n1.proc.send_signal(signal.SIGTERM)
    assert n1.proc.wait(30) == 0
    assert wait_until(n2.is_active, timeout=30), n2.log()[-3000:]
    n1.start_node()  # back, as a standby
    conn = pika_connect(n2.port)
    try:
        ch = conn.channel()
        for i in range(5):
            ch.queue_declare(f"b{i}", durable=True)
    finally:
        conn.close()
    store = SqlStore(cluster_url)
    store.open(migrate_schema=False)
    try:
        ids = [q["id"] for q in store.load_definitions().queues]
    finally:
        store.close()
    assert len(ids) == 10 and len(set(ids)) == 10


def test_processes_seeding_an_empty_store_at_once_write_one_guest(pg_database):
    url = pg_database[1]
    SqlStore(url).open()
    stores = [SqlStore(url) for _ in range(4)]
    for s in stores:
        s.open(migrate_schema=False)
    start = threading.Barrier(len(stores))
    results: list[bool] = []

    def seed(store, i):
        start.wait()
        results.append(store.seed_access(["/"], [("guest", f"hash{i}", "rabbit_password_hashing_sha256",
                                                  ["administrator"])], [("guest", "/", ".*", ".*", ".*")]))

    threads = [threading.Thread(target=seed, args=(s, i)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert sorted(results) == [False, False, False, True]
        defs = stores[0].load_definitions()
        assert [u["name"] for u in defs.users] == ["guest"]
        assert [(p["user"], p["vhost"]) for p in defs.permissions] == [("guest", "/")]
    finally:
        for s in stores:
            s.close()


def test_two_nodes_starting_at_once_on_an_empty_store_seed_one_guest(workdir, cluster_url):
    from cluster_support import NodeProcess
    both = [NodeProcess(workdir, cluster_url, name) for name in ("s1", "s2")]
    threads = [threading.Thread(target=n.start_node) for n in both]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert wait_until(lambda: sum(n.is_active() for n in both) == 1, timeout=30)
        store = SqlStore(cluster_url)
        store.open(migrate_schema=False)
        try:
            users = wait_until(lambda: store.load_definitions().users, timeout=10)
        finally:
            store.close()
        assert [u["name"] for u in users] == ["guest"]
        active = next(n for n in both if n.is_active())
        pika_connect(active.port).close()  # guest works
    finally:
        for n in both:
            n.kill()


def test_a_single_postgresql_broker_takes_queue_ids_in_blocks_across_restarts(workdir, pg_database):
    """Without --cluster too, a PostgreSQL store hands out queue ids from its sequence: more
    declares than one reserved block (refilled off the loop), a SIGKILL, more declares: every id
    is new, and the stored messages stay with their queues."""
    from eb_support import SubprocessBroker
    url = pg_database[1]
    broker = SubprocessBroker(workdir, ["--database-url", url]).start()
    try:
        conn = pika_connect(broker.port)
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(300):
            ch.queue_declare(f"a{i}", durable=True)
        ch.basic_publish("", "a299", b"kept", pika.BasicProperties(delivery_mode=2))
        conn.close()
        broker.kill()
        broker.start()
        conn = pika_connect(broker.port)
        ch = conn.channel()
        for i in range(20):
            ch.queue_declare(f"b{i}", durable=True)
        method, _props, body = ch.basic_get("a299", auto_ack=True)
        assert method is not None and body == b"kept"
        conn.close()
    finally:
        broker.kill()
    store = SqlStore(url)
    store.open(migrate_schema=False)
    try:
        ids = [q["id"] for q in store.load_definitions().queues]
    finally:
        store.close()
    assert len(ids) == 320 and len(set(ids)) == 320
