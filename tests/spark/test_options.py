"""Option validation and URL parsing: bad options fail fast with a clear message.  No JVM."""

from __future__ import annotations

import pytest

from spark_integration.amqp import ConnectionParams
from spark_integration.options import SourceOptions, parse_offset_spec

URL = "amqp://guest:guest@127.0.0.1:5999/%2F"


def parse(**kw):
    opts = {"url": URL, "queue": "q"}
    opts.update(kw)
    return SourceOptions.parse({k: v for k, v in opts.items() if v is not None})


def test_defaults():
    o = parse()
    assert o.queue == "q" and o.queue_type == "auto" and o.ack_mode == "peek"
    assert o.num_partitions == 1 and o.batch_size == 10000 and o.max_messages is None
    assert o.params.port == 5999 and o.params.vhost == "/"
    assert o.starting_offsets is None and o.ending_offsets == "latest"
    assert o.fail_on_data_loss is True


def test_option_names_are_case_insensitive():
    o = SourceOptions.parse({"URL": URL, "Queue": "q", "ACKMODE": "onRead", "numPartitions": "3",
                             "maxMessages": "10"})
    assert o.ack_mode == "onread" and o.num_partitions == 3 and o.max_messages == 10


@pytest.mark.parametrize("kw, message", [
    ({"url": None}, "option 'url' is required"),
    ({"queue": None}, "option 'queue' is required"),
    ({"url": "http://x"}, "must start with amqp:// or amqps://"),
    ({"url": "amqp://h:notaport/"}, "bad port"),
    ({"queueType": "lazy"}, "option 'queueType' must be one of"),
    ({"ackMode": "always"}, "option 'ackMode' must be peek or onRead"),
    ({"numPartitions": "0"}, "option 'numpartitions' must be >= 1"),
    ({"numPartitions": "two"}, "option 'numpartitions' must be an integer"),
    ({"maxMessages": "-1"}, "must be >= 0"),
    ({"failOnDataLoss": "maybe"}, "must be true or false"),
    ({"startingOffsets": "yesterday"}, "option 'startingOffsets' must be earliest | latest"),
    ({"startingOffsets": "-5"}, "must be >= 0"),
    ({"endingOffsets": "earliest"}, "option 'endingOffsets' must be latest"),
    ({"maxOffsetPerTrigger": "5"}, "unknown option(s) maxoffsetpertrigger"),
    ({"queueType": "classic", "startingOffsets": "earliest"}, "only applies to stream queues"),
    ({"queueType": "stream", "ackMode": "onRead"}, "only applies to classic/quorum"),
    ({"dedupe": "yes"}, "option 'dedupe' must be none or messageId"),
    ({"dedupe": "messageId"}, "needs option 'stateLocation'"),
    ({"queueType": "stream", "maxMessagesPerTrigger": "5"}, "only applies to classic/quorum"),
])
def test_bad_options_fail_fast(kw, message):
    with pytest.raises(ValueError) as info:
        parse(**kw)
    assert message in str(info.value)
    assert str(info.value).startswith("amqp data source:")


def test_peek_with_partitions_is_checked_once_type_is_known():
    o = parse(numPartitions="2")          # auto: the type is not known yet
    with pytest.raises(ValueError, match="single consumer"):
        o.checked("classic")
    assert o.checked("stream") is o      # a stream is read by offset ranges: fine
    assert parse(numPartitions="2", ackMode="onRead").checked("classic")


@pytest.mark.parametrize("raw, expected", [
    (None, None), ("earliest", "earliest"), ("LATEST", "latest"), ("42", 42), (7, 7),
    ('{"offset": 9}', 9), (" 0 ", 0),
])
def test_offset_spec(raw, expected):
    assert parse_offset_spec(raw, "startingOffsets", ("earliest", "latest")) == expected


@pytest.mark.parametrize("url, expected", [
    ("amqp://u:p@h:1234/v", ("h", 1234, "v", "u", "p", False)),
    ("amqp://h", ("h", 5672, "/", "guest", "guest", False)),
    ("amqp://h/", ("h", 5672, "/", "guest", "guest", False)),
    ("amqp://h/%2F", ("h", 5672, "/", "guest", "guest", False)),
    ("amqp://h/%2Fprod", ("h", 5672, "/prod", "guest", "guest", False)),
    ("amqps://a%40b:p%3Aw@h", ("h", 5671, "/", "a@b", "p:w", True)),
])
def test_url_parsing(url, expected):
    p = ConnectionParams.from_url(url)
    assert (p.host, p.port, p.vhost, p.username, p.password, p.tls) == expected


def test_url_query_parameters_and_redaction():
    p = ConnectionParams.from_url("amqp://u:secret@h/?heartbeat=0&connection_timeout=2.5")
    assert p.heartbeat == 0 and p.connect_timeout == 2.5
    assert "secret" not in p.redacted()


def test_url_with_several_nodes():
    p = ConnectionParams.from_url("amqps://u:p%40ss@n1:5671,n2,[::1]:5999/prod?heartbeat=5")
    assert p.nodes() == (("n1", 5671), ("n2", 5671), ("::1", 5999))
    assert (p.host, p.port, p.password, p.vhost, p.heartbeat) == ("n1", 5671, "p@ss", "prod", 5)
    assert p.redacted() == "amqps://u@n1:5671,n2:5671,::1:5999/prod"
    with pytest.raises(ValueError, match="empty host"):
        ConnectionParams.from_url("amqp://a:1,,b:2/")


def test_connect_tries_the_next_node(amqp_url):
    """A dead node first: the connection goes to the live one; `prefer` picks the start."""
    from spark_integration.amqp import Connection, ConnectionFailed
    live = ConnectionParams.from_url(amqp_url).nodes()[0]
    url = f"amqp://guest:guest@127.0.0.1:1,{live[0]}:{live[1]}/%2F"
    with Connection.connect(url) as c:
        assert c.node == live
    with Connection.connect(url, prefer=1) as c:
        assert c.node == live
    with pytest.raises(ConnectionFailed, match="cannot connect to any of 2 AMQP nodes"):
        Connection.connect("amqp://guest:guest@127.0.0.1:1,127.0.0.1:2/%2F")
