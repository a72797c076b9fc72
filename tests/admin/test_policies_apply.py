"""Policies change queues and exchanges at once, seen by real clients (pika) over real sockets:
TTL and dead-lettering of an existing queue without redeclaring it, precedence between
policies, queue arguments and operator policies, alternate exchanges, expiry, new queues."""

from __future__ import annotations

import pika
import pytest

from eb_support import uniq, wait_until


@pytest.fixture
def ch(pika_conn):
    channel = pika_conn.channel()
    yield channel
    if channel.is_open:
        channel.close()


@pytest.fixture
def policies(api):
    """Set policies through the API; every one set is cleared afterwards."""
    made = []

    def put(name, pattern, definition, *, priority=0, apply_to="queues", kind="policies", vhost="%2F"):
        path = f"/api/{kind}/{vhost}/{name}"
        status, body = api.put(path, {"pattern": pattern, "definition": definition, "priority": priority,
                                      "apply-to": apply_to})
        assert status in (201, 204), body
        made.append(path)
        return path
    yield put
    for path in made:
        api.delete(path)


def queue(api, name, vhost="%2F"):
    return api.ok("GET", f"/api/queues/{vhost}/{name}")


def depth(ch, name) -> int:
    return ch.queue_declare(name, passive=True).method.message_count


def publish(ch, rk, n=1, exchange=""):
    for i in range(n):
        ch.basic_publish(exchange, rk, f"m{i}".encode())


def test_policy_changes_ttl_of_an_existing_queue(api, ch, policies):
    """The issue's must-show: no redeclare, the queue's messages expire and are dead-lettered."""
    name, dead = uniq("orders"), uniq("dead")
    ch.exchange_declare("dlx-ttl", "fanout")
    ch.queue_declare(dead)
    ch.queue_bind(dead, "dlx-ttl")
    ch.queue_declare(name, durable=True)
    publish(ch, name)  # before the policy: no TTL, it stays
    assert queue(api, name)["policy"] is None
    policies("ttl", f"^{name}$", {"message-ttl": 200, "dead-letter-exchange": "dlx-ttl"})
    info = queue(api, name)
    assert (info["policy"], info["operator_policy"]) == ("ttl", None)
    assert info["effective_policy_definition"] == {"message-ttl": 200, "dead-letter-exchange": "dlx-ttl"}
    assert info["arguments"] == {}  # the declared arguments are unchanged
    # as in RabbitMQ, a message keeps the expiry it was enqueued with: the one from before the
    # policy has none and is still there
    assert ch.basic_get(name, auto_ack=True)[2] == b"m0"
    ch.basic_publish("", name, b"expires", pika.BasicProperties(delivery_mode=2))
    assert wait_until(lambda: depth(ch, dead) == 1, 5)
    method, props, body = ch.basic_get(dead, auto_ack=True)
    assert body == b"expires"
    death = props.headers["x-death"][0]
    assert (death["reason"], death["queue"]) == ("expired", name)
    assert depth(ch, name) == 0
    ch.queue_delete(name)
    ch.queue_delete(dead)


def test_highest_priority_wins_and_clearing_falls_back(api, ch, policies):
    name = uniq("prio")
    ch.queue_declare(name)
    low = policies("low", "^prio-", {"max-length": 1}, priority=1)
    policies("high", "^prio-", {"max-length": 3}, priority=7)
    policies("other-type", "^prio-", {"max-length": 100}, priority=99, apply_to="exchanges")
    assert queue(api, name)["policy"] == "high"
    publish(ch, name, 5)
    assert depth(ch, name) == 3  # drop-head at the winning policy's limit
    api.ok("DELETE", "/api/policies/%2F/high")
    assert queue(api, name)["policy"] == "low"
    assert depth(ch, name) == 1  # the next match applies at once, trimming the queue
    api.ok("DELETE", low)
    assert queue(api, name)["policy"] is None
    publish(ch, name, 4)
    assert depth(ch, name) == 5  # no limit any more
    ch.queue_delete(name)


def test_equal_priority_first_name_wins(api, ch, policies):
    name = uniq("tie")
    ch.queue_declare(name)
    policies("zeta", "^tie-", {"max-length": 9})
    policies("alpha", "^tie-", {"max-length": 2})
    assert queue(api, name)["policy"] == "alpha"
    ch.queue_delete(name)


def test_queue_dead_letter_exchange_wins_over_policy(api, ch, policies):
    own, plain, got_own, got_policy = uniq("dl"), uniq("dl"), uniq("own"), uniq("pol")
    ch.exchange_declare("dlx-own", "fanout")
    ch.exchange_declare("dlx-policy", "fanout")
    ch.queue_declare(got_own)
    ch.queue_bind(got_own, "dlx-own")
    ch.queue_declare(got_policy)
    ch.queue_bind(got_policy, "dlx-policy")
    ch.queue_declare(own, arguments={"x-dead-letter-exchange": "dlx-own"})
    ch.queue_declare(plain)
    policies("dl", "^dl-", {"dead-letter-exchange": "dlx-policy"})
    for q in (own, plain):
        publish(ch, q)
        method, _, _ = ch.basic_get(q)
        ch.basic_nack(method.delivery_tag, requeue=False)
    assert wait_until(lambda: depth(ch, got_own) == 1 and depth(ch, got_policy) == 1)
    assert queue(api, own)["arguments"] == {"x-dead-letter-exchange": "dlx-own"}
    for q in (own, plain, got_own, got_policy):
        ch.queue_delete(q)


def test_lower_limit_of_queue_argument_and_policy(api, ch, policies):
    name = uniq("lim")
    ch.queue_declare(name, arguments={"x-max-length": 50})
    policies("lim", "^lim-", {"max-length": 4})
    publish(ch, name, 10)
    assert depth(ch, name) == 4  # the policy's 4 < the argument's 50
    api.ok("DELETE", "/api/policies/%2F/lim")
    policies("lim", "^lim-", {"max-length": 500})
    publish(ch, name, 100)
    assert depth(ch, name) == 50  # the argument's 50 < the policy's 500
    ch.queue_delete(name)


def test_operator_policy_stricter_limit_wins(api, ch, policies):
    strict, lax = uniq("op"), uniq("op")
    ch.queue_declare(strict)
    policies("user", "^op-", {"max-length": 10, "message-ttl": 60000})
    op = policies("cap", f"^{strict}$", {"max-length": 3}, kind="operator-policies")
    policies("cap-lax", f"^{lax}$", {"max-length": 1000}, kind="operator-policies")
    info = queue(api, strict)
    assert (info["policy"], info["operator_policy"]) == ("user", "cap")
    assert info["effective_policy_definition"] == {"max-length": 3, "message-ttl": 60000}
    publish(ch, strict, 8)
    assert depth(ch, strict) == 3  # the operator policy's 3 < the policy's 10
    ch.queue_declare(lax)  # a new queue: policies apply as it is created
    info = queue(api, lax)
    assert (info["policy"], info["operator_policy"]) == ("user", "cap-lax")
    assert info["effective_policy_definition"]["max-length"] == 10
    publish(ch, lax, 15)
    assert depth(ch, lax) == 10  # the policy's 10 < the operator policy's 1000
    api.ok("DELETE", op)
    assert queue(api, strict)["operator_policy"] is None
    publish(ch, strict, 20)
    assert depth(ch, strict) == 10
    ch.queue_delete(strict)
    ch.queue_delete(lax)


def test_operator_policy_alone_and_overflow(api, ch, policies):
    name = uniq("oponly")
    ch.queue_declare(name)
    ch.confirm_delivery()
    policies("reject", f"^{name}$", {"max-length": 2, "overflow": "reject-publish"}, kind="operator-policies")
    publish(ch, name, 2)
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", name, b"over")
    assert queue(api, name)["effective_policy_definition"] == {"max-length": 2, "overflow": "reject-publish"}
    ch.queue_delete(name)


def test_apply_to_queue_types_and_unsupported_keys(api, ch, policies):
    classic, stream = uniq("types"), uniq("types")
    ch.queue_declare(classic)
    ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    policies("streams-only", "^types-", {"max-age": "1h"}, apply_to="streams", priority=5)
    policies("classic-only", "^types-", {"max-length": 7}, apply_to="classic_queues", priority=5)
    assert queue(api, classic)["policy"] == "classic-only"
    assert queue(api, stream)["policy"] == "streams-only"
    # a policy with one key the queue type does not support does not apply to it at all
    policies("mixed", "^types-", {"max-length": 1, "delivery-limit": 5}, priority=50)
    assert queue(api, classic)["policy"] == "classic-only"
    ch.queue_delete(classic)
    ch.queue_delete(stream)


def test_policy_expires_deletes_unused_queue(api, ch, policies):
    name = uniq("exp")
    ch.queue_declare(name)
    policies("expiry", f"^{name}$", {"expires": 300})
    assert wait_until(lambda: api.get(f"/api/queues/%2F/{name}")[0] == 404, 5)


def test_alternate_exchange_by_policy(api, ch, policies):
    src, ae, caught, own_ae, own_caught = uniq("src"), uniq("ae"), uniq("caught"), uniq("ae"), uniq("caught")
    for ex, kind in ((src, "direct"), (ae, "fanout"), (own_ae, "fanout")):
        ch.exchange_declare(ex, kind)
    ch.queue_declare(caught)
    ch.queue_bind(caught, ae)
    ch.queue_declare(own_caught)
    ch.queue_bind(own_caught, own_ae)
    ch.basic_publish(src, "nowhere", b"lost")
    policies("ae", f"^{src}$", {"alternate-exchange": ae}, apply_to="exchanges")
    ch.basic_publish(src, "nowhere", b"caught")
    assert wait_until(lambda: depth(ch, caught) == 1)
    assert ch.basic_get(caught, auto_ack=True)[2] == b"caught"
    # an alternate-exchange argument wins over the policy's
    ch.exchange_delete(src)
    ch.exchange_declare(src, "direct", arguments={"alternate-exchange": own_ae})
    ch.basic_publish(src, "nowhere", b"own")
    assert wait_until(lambda: depth(ch, own_caught) == 1)
    assert depth(ch, caught) == 0
    api.ok("DELETE", "/api/policies/%2F/ae")
    ch.exchange_delete(src)
    ch.exchange_declare(src, "direct")
    ch.basic_publish(src, "nowhere", b"lost again")
    for q in (caught, own_caught):
        ch.queue_delete(q)
    for ex in (src, ae, own_ae):
        ch.exchange_delete(ex)


def test_queues_listing_shows_policy_fields(api, ch, policies):
    name = uniq("show")
    ch.queue_declare(name)
    other = uniq("bare")
    ch.queue_declare(other)
    policies("show", f"^{name}$", {"message-ttl": 60000})
    rows = {q["name"]: q for q in api.ok("GET", "/api/queues/%2F")}
    assert rows[name]["policy"] == "show" and rows[name]["effective_policy_definition"] == {"message-ttl": 60000}
    assert rows[other]["policy"] is None and rows[other]["operator_policy"] is None
    assert rows[other]["effective_policy_definition"] == {}
    ch.queue_delete(name)
    ch.queue_delete(other)
