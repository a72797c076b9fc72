"""Queues follow the nodes (``--cluster-mode leaders``, real node processes on one throwaway
PostgreSQL database): the admin API of any node shows a queue's real counts and purges it."""

from __future__ import annotations

import pika
import requests
from cluster_support import publish_confirmed
from test_leaders import LEADERS, known_on

from eb_support import pika_connect, wait_until

AUTH = ("guest", "guest")


def api(node, path: str, method: str = "GET"):
    return requests.request(method, f"http://127.0.0.1:{node.admin_port}{path}", auth=AUTH, timeout=20)


def test_any_node_shows_the_leaders_counts_and_purges(nodes):
    n1, n2 = nodes("n1", *LEADERS), nodes("n2", *LEADERS)
    publish_confirmed(n1.port, "counted", [f"m{i}".encode() for i in range(7)])
    assert wait_until(lambda: known_on(n2, "counted"), timeout=20)
    holder = pika_connect(n1.port)  # two deliveries held unacked on the leader
    ch = holder.channel()
    ch.basic_qos(prefetch_count=2)
    ch.basic_consume("counted", lambda *a: None)
    assert wait_until(lambda: api(n1, "/api/queues/%2F/counted").json()["messages_unacknowledged"] == 2,
                      timeout=20)
    for path in ("/api/queues/%2F/counted", "/api/queues/%2F", "/api/queues"):
        got = api(n2, path).json()
        row = got if isinstance(got, dict) else next(q for q in got if q["name"] == "counted")
        assert (row["messages"], row["messages_ready"], row["messages_unacknowledged"], row["consumers"]) == \
            (7, 5, 2, 1), row
        assert row["leader"] == row["node"] == "n1"
        assert sorted(row["members"]) == ["n1", "n2"]
    assert api(n1, "/api/queues/%2F/counted").json()["leader"] == "n1"
    holder.close()
    assert api(n2, "/api/queues/%2F/counted/contents", "DELETE").status_code == 204  # purged by its leader
    assert wait_until(lambda: api(n1, "/api/queues/%2F/counted").json()["messages"] == 0, timeout=20)
    assert api(n2, "/api/queues/%2F/counted").json()["messages"] == 0
    assert api(n2, "/api/queues/%2F/nothing/contents", "DELETE").status_code == 404
    n1.kill()  # the leader gone: its figures are unknown on n2 (not 0) until the queue moves
    row = api(n2, "/api/queues/%2F/counted").json()
    assert row["messages"] is None or row["leader"] == "n2", row
