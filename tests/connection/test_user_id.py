"""RabbitMQ's validated user-id over a real socket (pika): a publish whose ``user_id`` is not
the authenticated user closes the channel with 406, unless the user has the impersonator tag."""

from __future__ import annotations

import pika
import pytest

from eb_support import wait_until


def _get(ch, queue):
    method, props, body = ch.basic_get(queue, auto_ack=True)
    return (props.user_id, body) if method is not None else None


def test_a_forged_user_id_closes_the_channel_and_is_not_enqueued(broker, connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("uid")
    ch.confirm_delivery()
    ch.basic_publish("", "uid", b"mine", pika.BasicProperties(user_id="guest"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_publish("", "uid", b"forged", pika.BasicProperties(user_id="mallory"))
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == ("PRECONDITION_FAILED - user_id property set to 'mallory' "
                                    "but authenticated user was 'guest'")
    assert conn.is_open  # a channel error: the connection stays
    ch2 = conn.channel()
    assert _get(ch2, "uid") == ("guest", b"mine")
    assert _get(ch2, "uid") is None


def test_an_administrator_may_not_forge_but_an_impersonator_may(broker, connect):
    broker.broker.add_user("boss", "pw", ["administrator"])
    broker.broker.add_user("relay", "pw", ["impersonator"])
    for user in ("boss", "relay"):
        broker.broker.set_permissions(user, "/", ".*", ".*", ".*")
    guest = connect().channel()
    guest.queue_declare("uid2")
    boss = connect(user="boss", password="pw").channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        boss.basic_publish("", "uid2", b"x", pika.BasicProperties(user_id="guest"))
        boss.basic_qos(prefetch_count=1)  # a round trip: the close arrives before its ok
    assert exc.value.reply_code == 406 and "authenticated user was 'boss'" in exc.value.reply_text
    relay = connect(user="relay", password="pw").channel()
    relay.confirm_delivery()
    relay.basic_publish("", "uid2", b"on behalf", pika.BasicProperties(user_id="alice"))
    assert wait_until(lambda: broker.broker.vhosts["/"].queues["uid2"].message_count == 1)
    assert _get(guest, "uid2") == ("alice", b"on behalf")


def test_in_a_transaction_the_publish_itself_is_refused(broker, connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("uid-tx")
    ch.tx_select()
    ch.basic_publish("", "uid-tx", b"ok", pika.BasicProperties(user_id="guest"))
    ch.basic_publish("", "uid-tx", b"forged", pika.BasicProperties(user_id="mallory"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.tx_commit()  # the channel was closed at the publish: nothing of the tx is routed
    assert exc.value.reply_code == 406 and "set to 'mallory'" in exc.value.reply_text
    assert broker.broker.vhosts["/"].queues["uid-tx"].message_count == 0
