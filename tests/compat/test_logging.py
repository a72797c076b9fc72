"""What an operator finds in the log (issue 12, §5): refused logins (user, mechanism, peer),
unknown vhosts and permission refusals at INFO as RabbitMQ logs them, connection closes with their
reason, and names that clients send escaped so that no name can forge a log line."""

from __future__ import annotations

import logging
import re
import socket

import pika
import pytest

from eb_support import pika_connect

from exchange_broker.testing import ThreadedBroker

FORGED = "2030-01-01 00:00:00,000 ERROR exchange_broker: forged line"
LINE_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


@pytest.fixture
def served(spawn_broker):
    """The real ``exchange-broker serve`` (in memory) whose stderr is the log under test."""
    return spawn_broker("--in-memory", "--log-level", "INFO")


def log_lines(proc, needle: str) -> list[str]:
    assert proc.wait_for_log(needle), proc.log()[-3000:]
    return [line for line in proc.log().splitlines() if needle in line]


def assert_no_forged_line(proc) -> None:
    for line in proc.log().splitlines():
        assert not line.startswith(FORGED[:10]), line  # no line starts with the forged date
        assert "\x1b" not in line and "\r" not in line


def test_queue_name_with_a_newline_is_one_log_line(served):
    name = f"evil\n{FORGED}\x1b[31m"
    conn = pika_connect(served.port)
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare(name, passive=True)
        assert info.value.reply_code == 404
    finally:
        conn.close()
    escaped = "evil" + FORGED + "\\x1b[31m"  # CR and LF are dropped from queue names, as RabbitMQ does
    [line] = log_lines(served, escaped)
    assert LINE_START.match(line) and " INFO exchange_broker.session: " in line
    assert f"404 NOT_FOUND - no queue '{escaped}' in vhost '/'" in line
    assert_no_forged_line(served)


def test_refused_login_and_unknown_vhost_are_logged_with_user_mechanism_and_peer(served):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika_connect(served.port, user="mallory\nINFO forged", password="wrong")
    [line] = log_lines(served, "login refused")
    assert " INFO " in line and "user 'mallory\\nINFO forged'" in line and "mechanism PLAIN" in line
    assert re.search(r"connection 127\.0\.0\.1:\d+", line)  # the peer
    assert "Login was refused using authentication mechanism PLAIN" in line

    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika_connect(served.port, vhost="no\nsuch-vhost")
    assert "(530)" in str(info.value)
    [line] = log_lines(served, "no\\nsuch-vhost")
    assert " INFO " in line and "user 'guest'" in line and "vhost no\\nsuch-vhost not found" in line
    assert_no_forged_line(served)


def test_connection_closes_are_logged_with_their_reason(served):
    conn = pika_connect(served.port)
    conn.close()
    [line] = log_lines(served, "closed by the client")
    assert "(user 'guest', vhost '/')" in line and "200 Normal shutdown" in line
    conn = pika_connect(served.port)
    conn.channel()
    conn._impl._transport._sock.shutdown(socket.SHUT_RDWR)  # a client that just vanishes
    [line] = log_lines(served, "client unexpectedly closed TCP connection")
    assert "(user 'guest', vhost '/')" in line


class Capture(logging.Handler):
    """The broker's records, formatted as ``exchange-broker serve`` writes them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.text: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.text.append(self.format(record))

    def lines(self, needle: str) -> list[str]:
        return [line for line in "\n".join(self.text).splitlines() if needle in line]


@pytest.fixture
def captured():
    handler = Capture()
    logger = logging.getLogger("exchange_broker")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def test_permission_refusals_are_logged_at_info(captured):
    with ThreadedBroker() as tb:
        def setup():
            tb.broker.add_user("limited\nuser", "pw", [])
            tb.broker.set_permissions("limited\nuser", "/", "^$", ".*", ".*")  # no configure
            tb.broker.add_user("outsider", "pw", [])                          # no vhost at all
        tb.call(setup)
        q = f"private\n{FORGED}"
        conn = pika_connect(tb.port, user="limited\nuser", password="pw")
        try:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                conn.channel().queue_declare(q)
            assert info.value.reply_code == 403
        finally:
            conn.close()
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
            pika_connect(tb.port, user="outsider", password="pw")
        assert "(530)" in str(info.value)
    [line] = captured.lines("ACCESS_REFUSED")
    assert " INFO exchange_broker.session: " in line
    # the queue name lost its LF (as in RabbitMQ); the user name keeps it, escaped
    assert "access to queue 'private" + FORGED + "' in vhost '/' refused for user 'limited\\nuser'" in line
    [line] = captured.lines("refused for user 'outsider'")
    assert " INFO " in line and "user 'outsider', vhost '/'" in line
    assert not captured.lines(FORGED[:10] + " ")[1:]  # the forged text only inside the one line
    assert all(LINE_START.match(line) for line in "\n".join(captured.text).splitlines())
