"""A message published through the admin API follows the same rules as a basic.publish (both go
through ``message.from_wire``): the per-message TTL (``expiration``) and the validated user-id."""

from __future__ import annotations

from eb_support import wait_until


def _publish(api, queue, properties):
    return api.call("POST", "/api/exchanges/%2F/amq.default/publish",
                    {"routing_key": queue, "payload": "x", "payload_encoding": "string",
                     "properties": properties})


def test_expiration_set_through_the_api_expires_the_message(api, admin_broker):
    api.put("/api/queues/%2F/ttl-api")
    assert _publish(api, "ttl-api", {"expiration": "300"}) == (200, {"routed": True})
    assert _publish(api, "ttl-api", {}) == (200, {"routed": True})  # no expiration: stays
    q = admin_broker.broker.vhosts["/"].queues["ttl-api"]
    assert q.message_count == 2
    # nobody consumes: the queue's expiry timer drops the head once its 300 ms are up
    assert wait_until(lambda: q.message_count == 1, timeout=10)
    got = api.ok("POST", "/api/queues/%2F/ttl-api/get", {"count": 5, "ackmode": "ack_requeue_false",
                                                         "encoding": "auto"})
    assert len(got) == 1 and "expiration" not in got[0]["properties"]


def test_a_bad_expiration_or_a_forged_user_id_is_a_400_and_nothing_is_routed(api, admin_broker):
    api.put("/api/queues/%2F/rules-api")
    status, body = _publish(api, "rules-api", {"expiration": "soon"})
    assert status == 400 and body["reason"] == "PRECONDITION_FAILED - invalid expiration 'soon': no_integer"
    status, body = _publish(api, "rules-api", {"user_id": "mallory"})
    assert status == 400 and body["reason"] == ("PRECONDITION_FAILED - user_id property set to "
                                                "'mallory' but authenticated user was 'guest'")
    assert _publish(api, "rules-api", {"user_id": "guest"}) == (200, {"routed": True})
    assert admin_broker.broker.vhosts["/"].queues["rules-api"].message_count == 1
