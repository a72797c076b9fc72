"""Cluster nodes as real processes on one throwaway PostgreSQL database: they see each other
(``cluster status``, ``/api/nodes``), one serves and the others stand by, a SIGKILLed active node
is dead within the failover timeout and a standby takes over with every confirmed message, a
paused one is replaced and stops when it resumes, bad flags are one line and exit 1."""

from __future__ import annotations

import signal
import subprocess
import sys

import pika
import requests
from cluster_support import (NodeProcess, cluster_status, delivered_mark, drain, hold_unacked, publish_confirmed,
                             wait_for_status)

from eb_support import REPO, pika_connect, subprocess_env, wait_until

def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exchange_broker", *args], capture_output=True, text=True,
                          timeout=60, cwd=str(REPO), env=subprocess_env())


def test_nodes_see_each_other_and_a_standby_takes_over_from_a_killed_active(nodes, cluster_url):
    n1 = nodes("n1")
    assert n1.is_active()
    n2, n3 = nodes.together(("n2",), ("n3",))  # two standbys of n1, started at once
    assert not n2.is_active() and not n3.is_active()
    bodies = [f"m{i}".encode() for i in range(20)]
    publish_confirmed(n1.port, "work", bodies)
    # one message delivered and left unacked when its node dies: it comes back marked redelivered
    holder = pika_connect(n1.port)
    method, _props, first = holder.channel().basic_get("work", auto_ack=False)
    assert first == b"m0"

    view = wait_for_status(cluster_url, lambda v: v.get("n1", {}).get("queues"))
    assert {name: (n["alive"], n["role"]) for name, n in view.items()} == {
        "n1": (True, "active"), "n2": (True, "standby"), "n3": (True, "standby")}
    assert view["n1"]["queues"] == [{"vhost": "/", "name": "work", "epoch": 1}]
    assert view["n1"]["amqp_address"] == f"127.0.0.1:{n1.port}"
    # the same through the CLI (JSON and the table) and the admin API of the active node
    listed = cluster_status(cluster_url)
    assert sorted(listed) == ["n1", "n2", "n3"] and all(n["alive"] for n in listed.values())
    table = run_cli("cluster", "status", "--database-url", cluster_url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["node", "state", "role"]
    assert [line.split()[:3] for line in lines[1:]] == [["n1", "alive", "active"], ["n2", "alive", "standby"],
                                                       ["n3", "alive", "standby"]]
    assert lines[1].endswith("work")
    api = requests.get(f"http://127.0.0.1:{n1.admin_port}/api/nodes", auth=("guest", "guest"), timeout=10)
    assert api.status_code == 200
    by_name = {n["name"]: n for n in api.json()}
    assert sorted(by_name) == ["n1", "n2", "n3"]
    assert all(n["running"] and n["alive"] for n in by_name.values())
    assert by_name["n1"]["queues_led"] == [{"vhost": "/", "name": "work", "epoch": 1}]
    assert by_name["n1"]["mem_used"] > 0 and by_name["n2"]["cluster_role"] == "standby"

    n1.kill()  # SIGKILL: no clean-up of any kind
    holder.close = lambda: None  # its socket died with the node
    view = wait_for_status(cluster_url, lambda v: not v["n1"]["alive"], timeout=15)
    assert not view["n1"]["alive"]  # dead once its failover timeout passed without a beat
    assert wait_until(lambda: n2.is_active() or n3.is_active(), timeout=20)
    new, other = (n2, n3) if n2.is_active() else (n3, n2)
    got = drain(new.port, "work")
    assert [body for body, _ in got] == bodies  # every confirmed message, in order
    assert got[0] == (b"m0", True) and not any(redelivered for _, redelivered in got[1:])
    view = wait_for_status(cluster_url, lambda v: v[new.name]["queues"])
    assert view[new.name]["role"] == "active" and view[other.name]["role"] == "standby"
    assert view[new.name]["queues"] == [{"vhost": "/", "name": "work", "epoch": 2}]  # a new leader: epoch 2

    # a clean stop of the active node hands over at once (its row goes, its leases end)
    publish_confirmed(new.port, "work", [b"after-failover"])
    assert new.terminate() == 0
    assert wait_until(other.is_active, timeout=20)
    assert drain(other.port, "work") == [(b"after-failover", False)]
    view = wait_for_status(cluster_url, lambda v: v[other.name]["queues"])
    assert new.name not in view
    assert view[other.name]["queues"] == [{"vhost": "/", "name": "work", "epoch": 3}]


def test_a_paused_active_node_is_replaced_and_stops_when_it_resumes(nodes, cluster_url):
    """SIGSTOP of the active node past its lease: a standby ends its database sessions (so its
    store lock goes and its open transactions roll back), takes over with every confirmed
    message, and the paused node, once resumed, delivers nothing more: it stops (exit 1) before
    it answers a client."""
    n1, n2 = nodes("p1"), nodes("p2")
    assert n1.is_active() and not n2.is_active()
    bodies = [f"k{i}".encode() for i in range(30)]
    publish_confirmed(n1.port, "kept", bodies)
    # a consumer on the paused node with prefetch 5: it holds 5 unacked deliveries when p1 stops
    holder, held = hold_unacked(n1.port, "kept", 5)
    # the queue's delivered mark (what makes a redelivery "redelivered") is stored by the next
    # group commit; wait for it, as the pause could otherwise come first
    assert wait_until(lambda: delivered_mark(cluster_url, "kept") > 0, timeout=10)
    assert wait_for_status(cluster_url, lambda v: v["p1"]["queues"])["p1"]["queues"][0]["epoch"] == 1
    n1.proc.send_signal(signal.SIGSTOP)  # a long pause: no beats; its database sessions stay open
    try:
        assert wait_until(n2.is_active, timeout=30), n2.log()[-3000:]
        assert "ended its" in n2.log() and "database session(s) so that a live node takes over" in n2.log()
        got = drain(n2.port, "kept")
        assert [b for b, _ in got] == bodies  # every confirmed message; the 5 held ones redelivered
        assert [b for b, redelivered in got if redelivered] == bodies[:5]
    finally:
        n1.proc.send_signal(signal.SIGCONT)
    # resumed, p1 must not deliver: the holder's socket gets nothing more and p1 exits with code 1
    try:
        holder.process_data_events(0.5)
    except pika.exceptions.AMQPError:
        pass  # p1 is gone
    assert n1.proc.wait(20) == 1
    assert len(held) == 5
    assert "stops serving" in n1.log()
    view = wait_for_status(cluster_url, lambda v: v["p2"]["role"] == "active")
    assert view["p2"]["role"] == "active"
    assert view["p2"]["queues"] == [{"vhost": "/", "name": "kept", "epoch": 2}]


def test_a_live_node_name_cannot_be_taken_twice(nodes, workdir, cluster_url):
    nodes("same")
    twin = NodeProcess(workdir, cluster_url, "same")
    try:
        twin.start_node()
        raise AssertionError("a second node named 'same' started")
    except RuntimeError:
        pass
    assert twin.proc.wait(20) == 1
    errors = [line for line in twin.log().splitlines() if "cannot start" in line]
    assert len(errors) == 1
    assert errors[0].startswith("exchange-broker: cannot start: the node name 'same' is in use by a live node (pid ")
    assert errors[0].endswith("); give this node another --node-name")


def test_bad_cluster_flags_are_one_line_and_exit_1(workdir):
    for args, needle in [
        (["serve", "--cluster", "--data-dir", str(workdir)], "--cluster needs a PostgreSQL --database-url"),
        (["serve", "--cluster", "--in-memory"], "--cluster needs a PostgreSQL --database-url"),
        (["serve", "--cluster", "--database-url", "postgresql://u@127.0.0.1:1/x", "--cluster-heartbeat", "5",
          "--cluster-failover-timeout", "2"], "--cluster-failover-timeout must be longer than --cluster-heartbeat"),
        (["serve", "--cluster", "--database-url", "postgresql://u@127.0.0.1:1/x", "--cluster-heartbeat", "0"],
         "--cluster-heartbeat must be a number of seconds"),
        (["cluster", "status"], "needs the cluster's PostgreSQL --database-url"),
        (["cluster", "status", "--database-url", f"sqlite:///{workdir}/b.db"], "needs the cluster's PostgreSQL"),
    ]:
        out = run_cli(*args)
        assert out.returncode == 1, (args, out.stderr)
        assert len(out.stderr.splitlines()) == 1 and needle in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr


def test_an_active_node_whose_store_lease_is_taken_stops_at_once(nodes, cluster_url):
    from sqlalchemy import create_engine, text
    node = nodes("f1")
    publish_confirmed(node.port, "q", [b"kept"])
    engine = create_engine(cluster_url)
    try:
        with engine.begin() as conn:  # as if another node had taken the store over meanwhile
            conn.execute(text("UPDATE queue_leases SET leader = 'intruder', epoch = epoch + 1 WHERE vhost = ''"))
    finally:
        engine.dispose()
    assert node.proc.wait(20) == 1  # fail-stop: no further write, exit code 1
    assert "cluster: node 'f1' stops serving: the store's lease (epoch 1) has another leader now" in node.log()
