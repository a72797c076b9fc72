"""What an operator reads when the broker starts: no alembic plugin noise, one line with the
store and its schema revision, the admin listener with the address it really bound; and
`postgres://` / `postgresql://` URLs accepted as PostgreSQL through psycopg."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from eb_support import close_quietly, free_port, pika_connect
from persistence import migrate


def head_revision() -> str:
    return ScriptDirectory.from_config(migrate.make_config()).get_current_head()


def test_start_up_log_has_no_alembic_noise(spawn_broker, workdir):
    b = spawn_broker("--data-dir", str(workdir / "data"))
    log = b.log()
    assert "alembic" not in log
    for noise in ("setup plugin", "Context impl", "transactional DDL", "Running upgrade"):
        assert noise not in log
    store_lines = [line for line in log.splitlines() if " store: " in line]
    assert len(store_lines) == 1, log
    assert store_lines[0].endswith(f"store: sqlite:///{workdir / 'data' / 'broker.db'} "
                                   f"(schema revision {head_revision()})")
    assert b.terminate() == 0


def test_admin_listener_logged_with_the_address_it_binds(spawn_broker, workdir):
    port = free_port()
    # a host name is resolved: the log says the address that was bound, and the port
    b = spawn_broker("--in-memory", "--admin-host", "localhost", "--admin-port", str(port))
    lines = [line for line in b.log().splitlines() if "admin API listening on" in line]
    assert len(lines) == 1, b.log()
    assert f"admin API listening on 127.0.0.1:{port} (http;" in lines[0] or \
        f"admin API listening on [::1]:{port} (http;" in lines[0]
    amqp = [line for line in b.log().splitlines() if "AMQP listener on" in line]
    assert amqp and amqp[0].endswith(f"AMQP listener on 127.0.0.1:{b.port}")
    assert b.terminate() == 0


def test_postgres_scheme_is_accepted_as_psycopg(spawn_broker, pg_database):
    _name, url = pg_database  # postgresql+psycopg://...
    for scheme in ("postgres://", "postgresql://"):
        b = spawn_broker("--database-url", url.replace("postgresql+psycopg://", scheme))
        assert "store: postgresql+psycopg://" in b.log()
        conn = pika_connect(b.port)
        try:
            ch = conn.channel()
            ch.queue_declare(f"q-{scheme[:-3]}", durable=True)
            ch.basic_publish("", f"q-{scheme[:-3]}", b"hello")
            assert ch.basic_get(f"q-{scheme[:-3]}", auto_ack=True)[2] == b"hello"
        finally:
            close_quietly(conn)
        assert b.terminate() == 0
