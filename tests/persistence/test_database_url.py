"""``persistence/database_url.py``: libpq's URL forms parsed once (sans-IO), and a multi-host URL
whose first host is down used for real by every kind of connection the broker opens."""

from __future__ import annotations

import pytest

from eb_support import free_port, wait_until
from exchange_broker.config import Config
from persistence.database_url import hide_password, parse


def test_multi_host_url_with_target_session_attrs():
    db = parse("postgresql://eb:s3cret@db1:5432,db2:5433/broker?target_session_attrs=read-write")
    assert db.is_postgres and db.url.startswith("postgresql+psycopg://")
    assert db.conninfo == "postgresql://eb:s3cret@db1:5432,db2:5433/broker?target_session_attrs=read-write"
    assert db.param("host") == "db1,db2" and db.param("port") == "5432,5433"
    assert db.param("target_session_attrs") == "read-write" and db.param("dbname") == "broker"
    assert db.hosts == ["db1:5432", "db2:5433"]
    assert db.display() == "postgresql+psycopg://eb:***@db1:5432,db2:5433/broker?target_session_attrs=read-write"


@pytest.mark.parametrize("url, key, value", [
    ("postgres://u@h/db?target_session_attrs=primary", "target_session_attrs", "primary"),
    ("postgresql://u@h/db?sslmode=require&application_name=orders", "sslmode", "require"),
    ("postgresql://u@h/db?sslmode=require&application_name=orders", "application_name", "orders"),
    ("postgresql:///broker?service=eb", "service", "eb"),
    ("postgresql+psycopg://u@h:6432/db", "port", "6432"),
])
def test_libpq_parameters(url, key, value):
    assert parse(url).param(key) == value


def test_empty_url_leaves_everything_to_the_pg_environment():
    db = parse("postgresql://")
    assert db.is_postgres and db.params == () and db.hosts == []
    assert db.connect_params()["connect_timeout"] == "10"  # a default the URL does not set
    assert "connect_timeout" not in parse("postgresql://h/db?connect_timeout=3").connect_params()


def test_with_params_keeps_the_hosts_and_replaces_a_value():
    db = parse("postgresql://u@h1:1,h2:2/db?application_name=a&sslmode=prefer")
    tagged = db.with_params(application_name="exchange-broker 12@host")
    assert tagged.param("application_name") == "exchange-broker 12@host"
    assert tagged.param("sslmode") == "prefer" and tagged.hosts == ["h1:1", "h2:2"]


def test_passwords_are_hidden():
    assert hide_password("postgresql://u:pw@h/db?password=x&sslmode=require") == \
        "postgresql://u:***@h/db?password=***&sslmode=require"
    assert hide_password("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_parsed_once_and_sqlite_passes_through():
    assert parse("postgresql://h/db") is parse("postgresql://h/db")
    assert parse("sqlite:////tmp/b.db").backend == "sqlite"
    assert Config(database_url="postgres://u@a:1,b:2/db").database_url == "postgresql+psycopg://u@a:1,b:2/db"
    Config(cluster=True, database_url="postgresql://u@a:1,b:2/db?target_session_attrs=read-write")


@pytest.mark.parametrize("url, expected", [
    ("notaurl", "is not a database URL"),
    ("postgresql://h:notaport/db", "'notaport' is not a port number"),
    ("postgresql://h1:1,h2:x/db", "'x' is not a port number"),
    ("postgresql://h/db?target_session_attrs=sometimes", "target_session_attrs 'sometimes'"),
    ("mysql://u:pw@h/db", "unsupported database 'mysql'"),
    ("postgresql+asyncpg://h/db", "driver 'asyncpg' is not supported"),
])
def test_bad_urls_are_one_line(url, expected):
    with pytest.raises(ValueError) as err:
        parse(url)
    assert expected in str(err.value) and "\n" not in str(err.value) and "pw" not in str(err.value)


# -- real connections -----------------------------------------------------------------------------

def _down_first(url: str) -> str:
    """``url`` (one host) with a host where nothing listens put first, libpq form."""
    db = parse(url)
    host, port = db.hosts[0].rsplit(":", 1) if db.hosts else ("127.0.0.1", "5432")
    user = db.param("user") or "postgres"
    return (f"postgresql://{user}@127.0.0.1:{free_port()},{host}:{port}/{db.param('dbname')}"
            f"?target_session_attrs=read-write")


def test_every_connection_takes_a_multi_host_url_whose_first_host_is_down(pg_database):
    from sqlalchemy import text

    from persistence.cluster_store import ClusterStore, DefinitionsListener
    from persistence.lock import store_lock
    from persistence.sql_store import SqlStore
    url = Config(database_url=_down_first(pg_database[1]), cluster=True).store_url
    store = SqlStore(url)
    store.open()  # the migrations, through the multi-host URL
    lock = store_lock(url)
    cluster = ClusterStore(url, 5.0)
    seen: list[int] = []
    listener = DefinitionsListener(cluster, cluster.definitions_version(), seen.append, seen.append, poll=0.2)
    try:
        lock.acquire()
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT current_database()")).scalar() == pg_database[0]
        assert cluster.register("n1", role="leader") == 1
        assert cluster.heartbeat("n1", 1)
        listener.start()
        assert listener.listening.wait(15)
        version = cluster.bump_definitions()
        assert wait_until(lambda: version in seen, 10)
    finally:
        listener.stop()
        lock.release()
        cluster.close()
        store.close()
