"""What a client of a leaders-mode node sees while the node cannot reach its database (a real node
process reaching PostgreSQL through a TCP proxy that stops forwarding, ``tcp_proxy.py``), with
``--database-outage-nack-after``:

* a persistent publish with confirms is nacked after the bound (not left waiting);
* a declare answers a channel error 541 at once, the admin API a 503 with a JSON reason; the
  connection goes on;
* once the lease may have run out, a transient queue keeps delivering while a durable queue (that
  another node could take over) and an MQTT subscription (a durable queue) deliver nothing;
* when the database is back, what waited is delivered on the same connections, and the node
  logged one line when it lost the database and one when it regained it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pika
import pytest
import requests
from cluster_support import FAILOVER_TIMEOUT, HEARTBEAT

from eb_support import pika_connect, steady_port, wait_until
from persistence.database_url import parse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mqtt"))
from paho_support import Paho  # noqa: E402  (tests/mqtt's paho-mqtt client)

pytestmark = pytest.mark.slow

NACK_AFTER = 3.0
LEASE = float(FAILOVER_TIMEOUT) - float(HEARTBEAT)  # the lease may have run out this long after the last beat


class Consumer:
    """One pika connection consuming (no-ack) from several queues; ``pump`` lets it read."""

    def __init__(self, port: int, queues: tuple[str, ...]) -> None:
        self.conn = pika_connect(port)
        self.ch = self.conn.channel()
        self.got: dict[str, list[bytes]] = {q: [] for q in queues}
        for q in queues:
            self.ch.basic_consume(q, lambda _ch, method, _props, body, q=q: self.got[q].append(body),
                                  auto_ack=True)

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.conn.process_data_events(time_limit=0.1)

    def pump_until(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            self.conn.process_data_events(time_limit=0.1)
        return bool(predicate())


def test_a_client_keeps_its_connection_and_transient_traffic_while_the_database_is_away(nodes, cluster_url,
                                                                                       tcp_proxy):
    db = parse(cluster_url)
    host, port = db.hosts[0].rsplit(":", 1)
    proxy = tcp_proxy(host, int(port))
    mqtt_port = steady_port()
    node = nodes("o1", "--cluster-mode", "leaders", "--mqtt-port", str(mqtt_port),
                 "--database-outage-nack-after", str(NACK_AFTER),
                 url=f"postgresql://{db.param('user')}@{proxy.address}/{db.param('dbname')}")
    setup = pika_connect(node.port)
    sch = setup.channel()
    sch.queue_declare("orders", durable=True)
    sch.queue_declare("scratch")
    sch.queue_declare("parked", durable=True)  # no consumer: a persistent message must be stored
    setup.close()
    device = Paho(mqtt_port, "device", clean=False)  # a persistent session: a durable queue
    assert device.subscribe("fleet/#", 1)[0].value == 1
    consumer = Consumer(node.port, ("orders", "scratch"))
    publisher = pika_connect(node.port)
    pub = publisher.channel()
    confirmed = publisher.channel()
    confirmed.confirm_delivery()

    def send(tag: str) -> None:  # transient messages: nothing to store
        pub.basic_publish("", "orders", f"orders-{tag}".encode())
        pub.basic_publish("", "scratch", f"scratch-{tag}".encode())
        pub.basic_publish("amq.topic", "fleet.1", f"mqtt-{tag}".encode())

    send("before")
    assert consumer.pump_until(lambda: consumer.got["orders"] and consumer.got["scratch"], 10)
    device.wait_messages(1)

    proxy.hang()
    cut = time.monotonic()
    time.sleep(0.3)  # (the proxy's loop takes the hang on)
    started = time.monotonic()
    with pytest.raises(pika.exceptions.NackError):  # the store hangs: nacked after the bound
        confirmed.basic_publish("", "parked", b"persistent", properties=pika.BasicProperties(delivery_mode=2))
    nacked_after = time.monotonic() - started
    assert NACK_AFTER - 0.5 <= nacked_after <= NACK_AFTER + 3, nacked_after

    assert node.wait_for_log("cannot reach the database", LEASE + 5)
    refused = publisher.channel()
    started = time.monotonic()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        refused.queue_declare("new-during-outage", durable=True)
    answered_in = time.monotonic() - started
    assert closed.value.reply_code == 541 and "cannot reach the database" in closed.value.reply_text
    assert answered_in < 2.0, answered_in
    r = requests.put(f"http://127.0.0.1:{node.admin_port}/api/queues/%2F/admin-during-outage",
                     json={"durable": True}, auth=("guest", "guest"), timeout=10)
    assert r.status_code == 503 and "cannot reach the database" in r.json()["reason"]

    time.sleep(max(0.0, cut + LEASE + 1.5 - time.monotonic()))  # past the lease: durable queues wait
    held_from = len(consumer.got["orders"]), len(device.messages)
    send("during")
    consumer.pump(3.0)
    assert consumer.got["scratch"][-1] == b"scratch-during"  # transient traffic flows
    assert len(consumer.got["orders"]) == held_from[0]        # a queue another node could take over waits
    assert len(device.messages) == held_from[1]               # and so does the MQTT subscription
    publisher.process_data_events(0)
    assert publisher.is_open and consumer.conn.is_open and not device.disconnected.is_set()

    proxy.heal()
    healed = time.monotonic()
    assert consumer.pump_until(lambda: b"orders-during" in consumer.got["orders"], 30)
    resumed_in = time.monotonic() - healed
    assert wait_until(lambda: any(m.payload == b"mqtt-during" for m in device.messages), 10)
    print(f"persistent publish nacked after {nacked_after:.1f} s; declare refused in {answered_in:.2f} s; "
          f"held deliveries out {resumed_in:.1f} s after the heal")
    assert node.wait_for_log("reaches the database again", 10)
    log = node.log()
    assert log.count("cluster: node 'o1' cannot reach the database") == 1  # one line when it lost it,
    assert log.count("reaches the database again") == 1                     # one when it regained it
    assert node.proc.poll() is None

    again = publisher.channel()  # the connection that saw the 541 declares again once it is back
    again.confirm_delivery()
    again.queue_declare("new-after-outage", durable=True)
    again.basic_publish("", "new-after-outage", b"after", properties=pika.BasicProperties(delivery_mode=2))
    assert again.basic_get("new-after-outage", auto_ack=True)[2] == b"after"
    publisher.close()
    consumer.conn.close()
    device.close()
