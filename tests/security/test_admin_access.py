"""The admin API's user tags and resource permissions, as RabbitMQ's management API applies them
(answers compared by hand with RabbitMQ 3.10's management plugin): only ``administrator`` users
manage users, vhosts and permissions (401 otherwise); ``management``/``monitoring`` users read;
declaring, deleting, purging and binding need the same configure/write/read permissions as the
AMQP methods; users without a management tag cannot use the API at all."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from exchange_broker.testing import ThreadedBroker

pytest.importorskip("fastapi")


class Api:
    def __init__(self, base: str, user: str, password: str) -> None:
        self.base = base
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def __call__(self, method: str, path: str, body=None) -> tuple[int, object]:
        req = urllib.request.Request(self.base + path, method=method,
                                     data=None if body is None else json.dumps(body).encode())
        req.add_header("Authorization", self.auth)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            raw = err.read()
            return err.code, json.loads(raw) if raw else None


@pytest.fixture(scope="module")
def env():
    with ThreadedBroker(admin=True) as tb:
        b = tb.broker
        tb.call(b.add_user, "mgmt", "mgmt", ["management"])
        tb.call(b.set_permissions, "mgmt", "/", "^cfg", "^wr", "^rd")
        tb.call(b.add_user, "mon", "mon", ["monitoring"])
        tb.call(b.add_user, "plain", "plain", [])
        tb.call(b.set_permissions, "plain", "/", ".*", ".*", ".*")
        guest = Api(tb.admin_url, "guest", "guest")
        guest("PUT", "/api/queues/%2F/plainq", {})
        guest("PUT", "/api/exchanges/%2F/plainx", {"type": "direct"})
        yield tb, guest, Api(tb.admin_url, "mgmt", "mgmt"), Api(tb.admin_url, "mon", "mon"), \
            Api(tb.admin_url, "plain", "plain")


def test_user_management_needs_administrator(env):
    tb, guest, mgmt, mon, _plain = env
    for api in (mgmt, mon):
        assert api("GET", "/api/users")[0] == 401
        assert api("PUT", "/api/users/zz", {"password": "x", "tags": ""})[0] == 401
        assert api("DELETE", "/api/users/guest")[0] == 401
        assert api("GET", "/api/permissions")[0] == 401
        assert api("PUT", "/api/permissions/%2F/mgmt", {"configure": ".*", "write": ".*", "read": ".*"})[0] == 401
        assert api("DELETE", "/api/permissions/%2F/mgmt")[0] == 401
        assert api("PUT", "/api/vhosts/zzvh")[0] == 401
        assert api("DELETE", "/api/vhosts/%2F")[0] == 401
    assert "zz" not in tb.broker.users and tb.broker.permissions[("mgmt", "/")] == ("^cfg", "^wr", "^rd")
    # an administrator may
    assert guest("PUT", "/api/users/zz", {"password": "x", "tags": "monitoring"})[0] in (201, 204)
    assert guest("PUT", "/api/permissions/%2F/zz", {"configure": "", "write": "", "read": ".*"})[0] in (201, 204)
    assert guest("GET", "/api/permissions/%2F/zz")[1]["read"] == ".*"
    assert guest("DELETE", "/api/permissions/%2F/zz")[0] == 204
    assert guest("DELETE", "/api/users/zz")[0] == 204
    assert "zz" not in tb.broker.users


def test_reading_is_allowed_to_management_and_monitoring(env):
    _tb, _guest, mgmt, mon, plain = env
    for api in (mgmt, mon):
        assert api("GET", "/api/whoami")[0] == 200
        assert api("GET", "/api/overview")[0] == 200
        assert api("GET", "/api/queues")[0] == 200
    assert mon("GET", "/api/vhosts")[0] == 200
    # no management tag: no API at all, whatever the AMQP permissions
    status, body = plain("GET", "/api/whoami")
    assert status == 401


def test_resource_operations_need_amqp_permissions(env):
    tb, guest, mgmt, _mon, _plain = env
    # configure
    assert mgmt("PUT", "/api/queues/%2F/plainq2", {})[0] == 401
    assert mgmt("PUT", "/api/queues/%2F/cfgq", {"auto_delete": True})[0] in (201, 204)
    assert mgmt("DELETE", "/api/queues/%2F/plainq")[0] == 401
    assert mgmt("PUT", "/api/exchanges/%2F/plainx2", {"type": "direct"})[0] == 401
    assert mgmt("DELETE", "/api/exchanges/%2F/plainx")[0] == 401
    assert mgmt("DELETE", "/api/queues/%2F/cfgq")[0] == 204
    # read
    assert mgmt("DELETE", "/api/queues/%2F/plainq/contents")[0] == 401
    assert mgmt("POST", "/api/queues/%2F/plainq/get", {"count": 1, "ackmode": "ack_requeue_true",
                                                        "encoding": "auto"})[0] == 401
    # write (queue) + read (exchange)
    assert mgmt("POST", "/api/bindings/%2F/e/plainx/q/plainq", {"routing_key": "k"})[0] == 401
    # publish: write on the exchange; RabbitMQ answers 400 naming amq.default
    status, _body = mgmt("POST", "/api/exchanges/%2F/amq.default/publish",
                         {"routing_key": "plainq", "payload": "x", "payload_encoding": "string", "properties": {}})
    assert status in (400, 401)
    assert "plainq" in tb.broker.vhosts["/"].queues and "plainx" in tb.broker.vhosts["/"].exchanges
    assert tb.broker.vhosts["/"].queues["plainq"].message_count == 0


# Made by RabbitMQ 3.10 for the password "secprobe", in the shape its /api/users and definitions
# export use (GET /api/users/secprobe after `rabbitmqctl add_user secprobe secprobe`)
RABBITMQ_USER = {"name": "rmq-user", "password_hash": "V8ieLtxl85j/TzyvRsDe2586PIRogn3+l7nSWYffWZGwPqSV",
                 "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["management"], "limits": {}}


def test_definitions_carry_password_hashes_and_import_rabbitmq_users(env):
    tb, guest, _mgmt, _mon, _plain = env
    doc = {"rabbit_version": "3.10.8", "users": [RABBITMQ_USER], "vhosts": [{"name": "/"}],
           "permissions": [{"user": "rmq-user", "vhost": "/", "configure": "", "write": "", "read": ".*"}]}
    assert guest("POST", "/api/definitions", doc)[0] in (200, 201, 204)
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", tb.port, credentials=pika.PlainCredentials("rmq-user", "secprobe"), heartbeat=0))
    conn.close()
    status, exported = guest("GET", "/api/definitions")
    assert status == 200
    users = {u["name"]: u for u in exported["users"]}
    assert users["rmq-user"]["password_hash"] == RABBITMQ_USER["password_hash"]
    assert users["rmq-user"]["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    # our own hashes have the same form: base64(4-byte salt + SHA-256(salt + password))
    assert len(base64.b64decode(users["guest"]["password_hash"])) == 36

