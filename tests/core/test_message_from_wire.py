"""``message.from_wire``: the one place a Message is made from published properties (sans-IO).
Every publishing path (AMQP, the admin API, move, the delayed exchange) goes through it."""

from __future__ import annotations

import pytest

from exchange_broker.core.auth import User
from exchange_broker.core.message import from_wire
from exchange_broker.protocol import codec
from exchange_broker.protocol.errors import AMQPError


def wire(**props) -> bytes:
    return codec.encode_properties(props)


def test_persistence_priority_and_per_message_ttl_come_from_the_properties():
    m = from_wire("ex", "rk", wire(delivery_mode=2, priority=7, expiration="1500"), b"body")
    assert (m.exchange, m.routing_key, m.body) == ("ex", "rk", b"body")
    assert m.persistent and m.priority == 7 and m.ttl == 1500
    plain = from_wire("", "q", wire(), b"")
    assert not plain.persistent and plain.priority == 0 and plain.ttl is None
    assert from_wire("", "q", wire(expiration="0"), b"").ttl == 0
    assert from_wire("", "q", wire(delivery_mode=1), b"").copy().ttl is None
    assert from_wire("", "q", wire(expiration="9"), b"").copy().ttl == 9  # each queue's copy
    # what Erlang's string:to_integer reads, up to RabbitMQ's ten years
    for value, ms in (("010", 10), ("+10", 10), ("315360000000", 315_360_000_000)):
        assert from_wire("", "q", wire(expiration=value), b"").ttl == ms


@pytest.mark.parametrize("value, text", [
    ("soon", "invalid expiration 'soon': no_integer"),
    (" 10", "invalid expiration ' 10': no_integer"),
    ("1.5", "invalid expiration '1.5': {leftover_string,\".5\"}"),
    ("10000foobar", "invalid expiration '10000foobar': {leftover_string,\"foobar\"}"),
    ('5"x', "invalid expiration '5\"x': {leftover_string,\"\\\"x\"}"),
    ("-5", "invalid expiration '-5': {value_negative,-5}"),
    ("315360000001", "invalid expiration '315360000001': {value_too_large,315360000001}"),
])  # RabbitMQ 3.10's texts, word for word
def test_a_bad_expiration_is_a_406_on_the_channel(value, text):
    with pytest.raises(AMQPError) as exc:
        from_wire("", "q", wire(expiration=value), b"")
    assert (exc.value.code, exc.value.text, exc.value.hard) == (406, text, False)
    assert (exc.value.class_id, exc.value.method_id) == (60, 40)  # basic.publish


def test_an_empty_expiration_is_no_integer():
    empty = b"\x01\x00" + b"\x00"  # the expiration flag, then a short string of length 0
    with pytest.raises(AMQPError, match="^406 PRECONDITION_FAILED - invalid expiration '': no_integer$"):
        from_wire("", "q", empty, b"")


def test_user_id_must_name_the_publishing_user():
    alice = User("alice", "", tags=["administrator"])  # administrator does not allow forging
    assert from_wire("", "q", wire(user_id="alice"), b"", alice).props["user_id"] == "alice"
    from_wire("", "q", wire(), b"", alice)  # no user_id: nothing to check
    with pytest.raises(AMQPError) as exc:
        from_wire("", "q", wire(user_id="bob"), b"", alice)
    assert exc.value.reply_text == ("PRECONDITION_FAILED - user_id property set to 'bob' but "
                                    "authenticated user was 'alice'")
    assert (exc.value.code, exc.value.hard) == (406, False)


def test_an_impersonator_may_set_any_user_id_and_the_broker_itself_is_not_checked():
    relay = User("relay", "", tags=["impersonator"])
    assert from_wire("", "q", wire(user_id="bob"), b"", relay).props["user_id"] == "bob"
    assert from_wire("", "q", wire(user_id="bob"), b"", None).props["user_id"] == "bob"


def test_the_user_id_is_checked_before_the_expiration():
    with pytest.raises(AMQPError) as exc:  # RabbitMQ's order: check_user_id_header first
        from_wire("", "q", wire(user_id="bob", expiration="x"), b"", User("alice", ""))
    assert "user_id property" in exc.value.text
