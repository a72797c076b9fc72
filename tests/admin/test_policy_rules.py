"""Policies as RabbitMQ 3.13 checks and applies them: validation texts, matching, precedence
(pure core logic: core/policy_defs.py and core/policies.py, no broker needed)."""

from __future__ import annotations

import pytest

from exchange_broker.core.policies import (OPERATOR_POLICY, POLICY, PolicyError, best, effective_arguments,
                                           merged_definition, parse_policy)
from exchange_broker.core.policy_defs import erl, max_age_ms


def pol(definition, name="p", pattern=".*", priority=0, apply_to="all", kind=POLICY):
    return parse_policy(kind, "/", name, pattern, definition, priority, apply_to)


def reason(kind=POLICY, pattern="a", definition=None, priority=None, apply_to=None) -> str:
    with pytest.raises(PolicyError) as info:
        parse_policy(kind, "/", "p", pattern, {"message-ttl": 1} if definition is None else definition,
                     priority, apply_to)
    return info.value.reason


def test_erlang_terms_as_rabbitmq_prints_them():
    assert erl("x") == '<<"x">>'
    assert erl('a"b\\') == '<<"a\\"b\\\\">>'
    assert erl("é") == '<<"é"/utf8>>'
    assert erl(None) == "null" and erl(True) == "true" and erl(1.5) == "1.5" and erl(1e22) == "1.0e22"
    assert erl({"b": [1, "x"], "a": 2}) == '#{<<"a">> => 2,<<"b">> => [1,<<"x">>]}'
    assert erl([("foo", 1)]) == '[{<<"foo">>,1}]'


def test_defaults_and_shape():
    p = parse_policy(POLICY, "v", "n", "^a", {"message-ttl": 5}, None, None)
    assert (p.priority, p.apply_to) == (0, "all")
    assert p.info() == {"vhost": "v", "name": "n", "pattern": "^a", "apply-to": "all",
                        "definition": {"message-ttl": 5}, "priority": 0}
    assert parse_policy(POLICY, "v", "n", "a", {"max-age": "10s"}, 1.5, "streams").priority == 1.5
    for apply_to in ("queues", "exchanges", "all", "classic_queues", "quorum_queues", "streams"):
        assert parse_policy(POLICY, "v", "n", "a", {"expires": 1}, 0, apply_to).apply_to == apply_to


def test_every_error_listed_in_rabbitmqs_order():
    text = reason(pattern="(", definition={"message-ttl": "x", "foo": 1}, priority="x", apply_to="bogus")
    lines = text.split("\n")
    assert lines[0] == "Validation failed" and lines[1] == ""
    assert lines[2] == '<<"x">> is not a valid message TTL'
    assert lines[3] == ("apply-to 'bogus' unrecognised; should be one of: 'queues', 'classic_queues',  "
                        "'quorum_queues', 'streams', 'exchanges', or 'all'")
    assert lines[4].startswith("pattern should be regular expression but is invalid: {")
    assert lines[5] == 'priority should be a number, actually was <<"x">>'
    assert text.endswith("\n")


@pytest.mark.parametrize("definition, message", [
    ({}, "no policy provided"),
    ({"message-ttl": -1}, "-1 is not a valid message TTL"),
    ({"message-ttl": 1.5}, "1.5 is not a valid message TTL"),
    ({"message-ttl": True}, "true is not a valid message TTL"),
    ({"expires": 0}, "0 is not a valid queue expiry"),
    ({"max-length": "10"}, '<<"10">> is not a valid maximum length'),
    ({"max-length-bytes": -5}, "-5 is not a valid maximum length in bytes"),
    ({"overflow": "drop-tail"}, '<<"drop-tail">> is not a valid overflow value'),
    ({"dead-letter-exchange": 5}, "5 is not a valid dead letter exchange name"),
    ({"dead-letter-routing-key": None}, "null is not a valid dead letter routing key"),
    ({"dead-letter-strategy": "never"}, '<<"never">> is not a valid dead letter strategy'),
    ({"alternate-exchange": {"a": [1, "b"]}}, '#{<<"a">> => [1,<<"b">>]} is not a valid alternate exchange name'),
    ({"delivery-limit": "many"}, '<<"many">> is not a valid delivery limit'),  # 4.x: -1 is valid (no limit)
    ({"max-age": "1Q"}, '<<"1Q">> is not a valid max age'),
    ({"max-age": "0D"}, '<<"0D">> is not a valid max age'),
    ({"queue-mode": "fast"}, '<<"fast">> is not a valid queue-mode value'),
    ({"queue-version": 3}, "3 is not a valid queue-version value"),
    ({"stream-max-segment-size-bytes": 3_000_000_001}, "3000000001 is not a valid segment size"),
    ({"stream-filter-size-bytes": 8}, "8 is not a valid filter size. Valid range is 16-255"),
    ({"ha-mode": "bad"}, '<<"bad">> is not a valid ha-mode value'),
    ({"ha-params": 2}, "ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown"),
    ({"ha-mode": "exactly", "ha-params": 0}, 'ha-mode="exactly" takes an integer, 0 given'),
    ({"single-active-consumer": True}, '[{<<"single-active-consumer">>,true}] are not recognised policy settings'),
    ({"max-priority": 5, "foo": 1}, '[{<<"foo">>,1},{<<"max-priority">>,5}] are not recognised policy settings'),
    ("x", 'definition must be a dictionary: <<"x">>'),
])
def test_definition_errors(definition, message):
    assert reason(definition=definition) == f"Validation failed\n\n{message}\n"


def test_pattern_and_priority_errors():
    assert reason(pattern=5) == "Validation failed\n\npattern should be a binary but was 5\n"
    assert reason(priority=True) == "Validation failed\n\npriority should be a number, actually was true\n"
    assert reason(apply_to="exchange").startswith("Validation failed\n\napply-to 'exchange' unrecognised")


def test_accepted_keys():
    full = {"alternate-exchange": "ae", "consumer-timeout": 1000, "dead-letter-exchange": "dlx",
            "dead-letter-routing-key": "rk", "dead-letter-strategy": "at-least-once", "message-ttl": 0,
            "expires": 1, "max-length": 0, "max-length-bytes": 10, "max-in-memory-length": 1,
            "max-in-memory-bytes": 1, "queue-mode": "lazy", "queue-version": 2, "overflow": "reject-publish-dlx",
            "delivery-limit": 3, "max-age": "7D", "stream-max-segment-size-bytes": 500_000,
            "stream-filter-size-bytes": 16, "queue-leader-locator": "balanced", "initial-cluster-size": 3,
            "ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic", "target-group-size": 3}
    assert pol(full).definition == full
    assert max_age_ms("7D") == 7 * 86_400_000 and max_age_ms("2h") == 7_200_000 and max_age_ms("x") is None


def test_operator_policy_keys():
    ok = {"expires": 5, "message-ttl": 1, "max-length": 2, "max-length-bytes": 3, "max-in-memory-length": 4,
          "max-in-memory-bytes": 5, "delivery-limit": 6, "queue-version": 2, "overflow": "reject-publish"}
    assert pol(ok, kind=OPERATOR_POLICY).definition == ok
    for key, value in (("dead-letter-exchange", "x"), ("alternate-exchange", "x"), ("max-age", "1D"),
                       ("consumer-timeout", 5), ("queue-mode", "lazy")):
        text = reason(kind=OPERATOR_POLICY, definition={key: value})
        assert text == f"Validation failed\n\n[{{{erl(key)},{erl(value)}}}] are not recognised policy settings\n"


def test_highest_priority_wins_ties_by_name():
    a, b, c = pol({"expires": 1}, "a", priority=1), pol({"expires": 1}, "b", priority=5), \
        pol({"expires": 1}, "c", priority=5)
    assert best([a, b, c]).name == "b" and best([c, b, a]).name == "b"
    assert best([a]).name == "a" and best([]) is None


def test_operator_merge():
    user = pol({"max-length": 100, "message-ttl": 10, "overflow": "drop-head", "dead-letter-exchange": "d"})
    op = pol({"max-length": 50, "message-ttl": 20, "overflow": "reject-publish", "expires": 9},
             kind=OPERATOR_POLICY)
    assert merged_definition(user, op) == {"dead-letter-exchange": "d", "expires": 9, "max-length": 50,
                                           "message-ttl": 10, "overflow": "reject-publish"}
    assert merged_definition(None, op) == op.definition and merged_definition(user, None) == user.definition
    assert merged_definition(None, None) == {}


def test_queue_arguments_against_policy_per_queue_type():
    merged = {"message-ttl": 100, "max-length": 10, "expires": 5000, "overflow": "reject-publish",
              "dead-letter-exchange": "pdlx", "dead-letter-routing-key": "prk"}
    declared = {"x-message-ttl": 50, "x-max-length": 20, "x-expires": 9000, "x-overflow": "drop-head",
                "x-dead-letter-exchange": "qdlx"}
    classic = effective_arguments(declared, "classic", merged)
    assert classic == {"x-message-ttl": 50, "x-max-length": 10, "x-expires": 5000, "x-overflow": "drop-head",
                       "x-dead-letter-exchange": "qdlx", "x-dead-letter-routing-key": "prk"}
    quorum = effective_arguments({**declared, "x-queue-type": "quorum"}, "quorum", {**merged, "expires": 90000})
    assert quorum["x-overflow"] == "reject-publish" and quorum["x-expires"] == 90000  # the policy's
    assert quorum["x-message-ttl"] == 50 and quorum["x-dead-letter-exchange"] == "qdlx"
    stream = effective_arguments({"x-queue-type": "stream", "x-max-age": "1D", "x-max-length-bytes": 10},
                                 "stream", {"max-age": "2h", "max-length-bytes": 99})
    assert stream["x-max-age"] == "2h" and stream["x-max-length-bytes"] == 99  # the policy wins
    # a routing key from a policy without any dead-letter exchange is inert (dropped)
    assert effective_arguments({}, "classic", {"dead-letter-routing-key": "k"}) == {}
    assert effective_arguments({}, "classic", {"consumer-timeout": 0}) == {}
