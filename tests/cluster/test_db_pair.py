"""The test fixtures of a database failover, for real: a primary with a streaming standby
(``pg_pair.py``) behind a libpq multi-host URL, and the TCP proxy (``tcp_proxy.py``)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from eb_support import PG_ADMIN_URL

from exchange_broker.config import Config
from persistence.database_url import parse
from persistence.sql_store import SqlStore
from sqlalchemy import text


def _server_port(url: str) -> tuple[int, bool]:
    with parse(url).connect(autocommit=True) as conn:
        port, recovery = conn.execute("SELECT current_setting('port')::int, pg_is_in_recovery()").fetchone()
    return port, recovery


@pytest.mark.slow  # initdb + pg_basebackup: ~10 s
def test_a_multi_host_url_skips_the_standby_and_follows_a_promotion(pg_pair):
    assert _server_port(pg_pair.url) == (pg_pair.ports["primary"], False)  # the standby is listed first
    store = SqlStore(Config(database_url=pg_pair.url).store_url)
    store.open()  # the schema, on the primary; streamed to the standby
    try:
        with store.engine.begin() as conn:
            conn.execute(text("CREATE TABLE probe (n int)"))
            conn.execute(text("INSERT INTO probe VALUES (1)"))
        pg_pair.stop("primary")
        pg_pair.promote()
        assert _server_port(pg_pair.url) == (pg_pair.ports["standby"], False)
        with store.engine.begin() as conn:  # the pool's dead connection is replaced on the new primary
            assert conn.execute(text("SELECT count(*) FROM probe")).scalar() == 1
            assert conn.execute(text("SELECT current_setting('port')::int")).scalar() == pg_pair.ports["standby"]
    finally:
        store.close()


def test_the_proxy_forwards_hangs_heals_and_resets(tcp_proxy):
    db = parse(PG_ADMIN_URL)
    host, port = db.hosts[0].rsplit(":", 1)
    proxy = tcp_proxy(host, int(port))
    url = f"postgresql://{db.param('user')}@{proxy.address}/{db.param('dbname')}"
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError:
        pytest.skip("PostgreSQL unreachable")
    with conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        proxy.hang()
        started = time.monotonic()
        threading.Timer(1.0, proxy.heal).start()
        assert conn.execute("SELECT 2").fetchone() == (2,)  # held during the hang, answered after it
        assert time.monotonic() - started >= 0.9
        assert proxy.reset() >= 2  # both ends of the one connection
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 3")
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as again:  # new connections pass
        assert again.execute("SELECT 4").fetchone() == (4,)
