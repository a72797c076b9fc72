"""`exchange-broker admin ...` over the REST API: in-process (main(argv)) and as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from exchange_broker.cli import main as broker_main


@pytest.fixture
def admin(admin_broker, capsys):
    """Run `exchange-broker admin ARGS` in-process; returns (exit code, stdout, stderr)."""
    def run(*args: str) -> tuple[int, str, str]:
        code = broker_main(["admin", "--url", admin_broker.admin_url, *args])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def test_declare_list_publish_get_purge_delete(admin, api):
    assert admin("declare", "queue", "jobs", "--durable", "--arguments", '{"x-max-length": 50}')[0] == 0
    assert admin("declare", "exchange", "work", "--type", "topic", "--durable")[0] == 0
    code, out, _ = admin("declare", "binding", "--source", "work", "--destination", "jobs",
                         "--routing-key", "job.*")
    assert code == 0 and "binding declared" in out
    code, out, _ = admin("list", "queues")
    assert code == 0
    header, *rows = out.strip().splitlines()
    assert header.split()[:2] == ["vhost", "name"]
    assert any(r.split()[1] == "jobs" for r in rows)
    code, out, _ = admin("list", "exchanges", "--format", "json")
    assert "work" in {x["name"] for x in json.loads(out)}
    assert "(AMQP default)" in admin("list", "exchanges")[1]
    code, out, _ = admin("list", "bindings")
    assert "job.*" in out
    code, out, _ = admin("publish", "--exchange", "work", "--routing-key", "job.1", "--payload", "do it",
                         "--properties", '{"delivery_mode": 2}')
    assert code == 0 and out.strip() == "message published"
    code, out, _ = admin("publish", "--exchange", "work", "--routing-key", "nope", "--payload", "x")
    assert code == 4 and "not routed" in out
    code, out, _ = admin("get", "jobs", "--format", "json")
    msgs = json.loads(out)
    assert msgs[0]["payload"] == "do it" and msgs[0]["properties"] == {"delivery_mode": 2}
    assert api.ok("GET", "/api/queues/%2F/jobs")["messages"] == 1  # default ackmode requeues
    code, out, _ = admin("get", "jobs", "--ackmode", "ack_requeue_false")
    assert code == 0 and "do it" in out
    admin("publish", "-k", "jobs", "--payload", "direct")  # default exchange
    assert api.ok("GET", "/api/queues/%2F/jobs")["messages"] == 1
    assert admin("purge", "jobs")[0] == 0
    assert api.ok("GET", "/api/queues/%2F/jobs")["messages"] == 0
    assert admin("delete", "binding", "--source", "work", "--destination", "jobs",
                 "--routing-key", "job.*")[0] == 0
    assert api.ok("GET", "/api/bindings/%2F/e/work/q/jobs") == []
    assert admin("delete", "queue", "jobs")[0] == 0
    assert admin("delete", "exchange", "work", "--if-unused")[0] == 0
    code, _out, err = admin("delete", "queue", "jobs")
    assert code == 1 and "404" in err and "Object Not Found" in err


def test_list_connections_and_close(admin, pika_conn):
    pika_conn.channel()
    code, out, _ = admin("list", "connections", "--format", "json")
    [conn] = json.loads(out)
    assert conn["user_provided_name"] == "test-client"
    assert admin("list", "channels")[0] == 0
    code, out, _ = admin("close", "connection", conn["name"], "--reason", "bye")
    assert code == 0 and "closed" in out


def test_export_import(admin, api, admin_broker, tmp_path):
    api.put("/api/vhosts/exported")
    api.put("/api/queues/exported/q1", {"durable": True})
    api.put("/api/exchanges/exported/x1", {"type": "fanout", "durable": True})
    api.post("/api/bindings/exported/e/x1/q/q1", {})
    path = tmp_path / "defs.json"
    assert admin("export", str(path))[0] == 0
    defs = json.loads(path.read_text())
    assert {"name": "q1", "vhost": "exported", "durable": True, "auto_delete": False, "arguments": {}} \
        in defs["queues"]
    code, out, _ = admin("export")
    assert json.loads(out)["queues"] == defs["queues"]
    api.delete("/api/vhosts/exported")
    assert api.get("/api/queues/exported/q1")[0] == 404
    assert admin("import", str(path))[0] == 0
    assert api.ok("GET", "/api/queues/exported/q1")["durable"] is True
    assert api.ok("GET", "/api/bindings/exported/e/x1/q/q1")[0]["destination"] == "q1"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert admin("import", str(bad))[0] == 2


def test_cli_errors(admin_broker, capsys):
    code = broker_main(["admin", "--url", admin_broker.admin_url, "--password", "wrong", "list", "queues"])
    assert code == 1 and "401" in capsys.readouterr().err
    code = broker_main(["admin", "--url", "http://127.0.0.1:9", "overview"])
    assert code == 3 and "cannot reach" in capsys.readouterr().err


def test_cli_subprocess(admin_broker, api):
    """The installed entry point's module form, options after the command, env for the URL."""
    api.put("/api/queues/%2F/from-subprocess")
    env = dict(os.environ, EXCHANGE_BROKER_ADMIN_URL=admin_broker.admin_url)
    proc = subprocess.run([sys.executable, "-m", "exchange_broker", "admin", "list", "queues",
                           "--format", "json", "--vhost", "/"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [x["name"] for x in json.loads(proc.stdout)] == ["from-subprocess"]
