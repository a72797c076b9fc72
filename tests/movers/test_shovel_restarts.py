"""Shovels between two broker processes of this project that are restarted while the shovel
runs: 5,000 confirmed persistent messages each way, none lost and none duplicated (message ids counted). The shovel's
own broker restarting restores the shovel from its store and it carries on; the `exchange-broker
admin shovel` commands against a real process."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

import pytest
from admin_helpers import Api

from eb_support import SubprocessBroker, close_quietly, pika_connect, steady_port, subprocess_env, wait_until
from mover_support import depth, publish

N = 5000
PREFETCH = 100


@pytest.fixture
def pair(workdir):
    """Two brokers on ports that stay theirs across restarts; ``a`` has the admin API."""
    (workdir / "a").mkdir()
    (workdir / "b").mkdir()
    a = SubprocessBroker(workdir / "a", ["--port", str(steady_port()), "--admin-port", str(steady_port())])
    b = SubprocessBroker(workdir / "b", ["--port", str(steady_port())])
    a.admin_url = f"http://127.0.0.1:{a.args[3]}"
    try:
        yield a.start(), b.start()
    finally:
        for p in (a, b):
            p.kill()
            print(f"----- {p.log_path} -----\n{p.log()[-5000:]}")


def drain_ids(port: int, queue: str) -> Counter:
    conn = pika_connect(port)
    try:
        ch = conn.channel()
        ids: Counter = Counter()
        while True:
            method, props, _body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return ids
            ids[props.message_id] += 1
    finally:
        close_quietly(conn)


def restart(p: SubprocessBroker) -> None:
    assert p.terminate() == 0
    p.start()


def check_all_moved(ids: Counter) -> None:
    """None lost, none duplicated: a broker stopped with SIGTERM sends the confirms of what it
    stored before it closes (listener.settle), and a shovel stopped with its broker waits for its
    last confirms and sends their acks before it closes the source (forwarding.Forwarding._drain,
    Connection.close)."""
    assert set(ids) == {str(i) for i in range(N)}, f"{N - len(ids)} lost"
    assert sum(ids.values()) == N, f"{sum(ids.values()) - N} duplicated"


@pytest.mark.slow
def test_5000_each_way_while_the_destination_restarts(pair):
    a, b = pair
    api = Api(a.admin_url)
    # a -> b; b restarts midway
    publish(a.port, "out", N, size=100)
    value = {"src-uri": "amqp://", "src-queue": "out", "dest-uri": f"amqp://guest:guest@127.0.0.1:{b.port}",
             "dest-queue": "in", "prefetch-count": PREFETCH, "reconnect-delay": 0.5}
    assert api.put("/api/parameters/shovel/%2F/push", {"value": value})[0] == 201
    assert wait_until(lambda: depth(b.port, "in") >= N // 3, 60)
    restart(b)
    assert wait_until(lambda: depth(a.port, "out") == 0, 120), api.get("/api/shovels")[1]
    assert wait_until(lambda: api.get("/api/shovels/vhost/%2F/push")[1]["state"] == "running", 30)
    check_all_moved(drain_ids(b.port, "in"))
    episode = [ln for ln in a.log().splitlines() if "shovel 'push'" in ln]
    assert len(episode) == 2 and "WARNING" in episode[0] and "running again" in episode[1], episode
    assert api.delete("/api/parameters/shovel/%2F/push")[0] == 204
    # b -> a (the shovel pulls from the remote broker); a, the destination and the shovel's own
    # broker, restarts midway: the shovel comes back from a's store and carries on
    publish(b.port, "back", N, size=100)
    value = {"src-uri": f"amqp://guest:guest@127.0.0.1:{b.port}", "src-queue": "back", "dest-uri": "amqp://",
             "dest-queue": "home", "prefetch-count": PREFETCH, "reconnect-delay": 0.5}
    assert api.put("/api/parameters/shovel/%2F/pull", {"value": value})[0] == 201
    assert wait_until(lambda: depth(a.port, "home") >= N // 3, 60)
    restart(a)
    assert wait_until(lambda: depth(b.port, "back") == 0, 120)
    assert wait_until(lambda: depth(a.port, "home") >= N, 30)
    check_all_moved(drain_ids(a.port, "home"))
    assert [s["name"] for s in api.get("/api/shovels")[1]] == ["pull"]


def test_admin_shovel_commands(pair):
    a, b = pair
    publish(a.port, "cli-src", 10)

    def admin(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "exchange_broker", "admin", "--url", a.admin_url, *args],
                              capture_output=True, text=True, env=subprocess_env(), timeout=60)

    done = admin("shovel", "declare", "c1", "--src-uri", "amqp://", "--src-queue", "cli-src",
                 "--dest-uri", f"amqp://guest:guest@127.0.0.1:{b.port}", "--dest-queue", "cli-dst",
                 "--prefetch-count", "5", "--dest-add-forward-headers")
    assert done.returncode == 0 and "shovel declared: c1" in done.stdout, done.stderr
    assert wait_until(lambda: depth(b.port, "cli-dst") == 10, 30)
    listed = admin("shovel", "list", "--format", "json")
    assert '"state": "running"' in listed.stdout and "guest:guest" not in listed.stdout
    assert admin("shovel", "restart", "c1").returncode == 0
    bad = admin("shovel", "declare", "c2", "--src-uri", "amqp://", "--dest-uri", "amqp://")
    assert bad.returncode == 1 and bad.stderr.strip().count("\n") == 0
    assert "Must specify 'src-exchange' or 'src-queue'" in bad.stderr
    assert admin("shovel", "delete", "c1").returncode == 0
    assert admin("shovel", "delete", "c1").returncode == 1
    time.sleep(0.2)
    assert Api(a.admin_url).get("/api/shovels")[1] == []
