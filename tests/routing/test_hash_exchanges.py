"""Pure tests of the x-consistent-hash, x-modulus-hash and x-local-random binding indexes."""
from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import routing
from routing.consistent_hash import ConsistentHashIndex, hash_on, jump_hash
from routing.local_random import LocalRandomIndex
from routing.modulus_hash import ModulusHashIndex


def q(name):
    return ("q", name)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), min_size=2, max_size=6))
def test_consistent_hash_distribution_follows_weights(weights):
    index = ConsistentHashIndex(None)
    for i, w in enumerate(weights):
        index.bind(q(f"q{i}"), str(w))
    n = 20_000
    counts = Counter(index.match(f"key-{k}")[0] for k in range(n))
    total = sum(weights)
    for i, w in enumerate(weights):
        expected = n * w / total
        # binomial spread: 5 standard deviations (plus a little) never fails by chance
        sigma = (n * (w / total) * (1 - w / total)) ** 0.5
        assert abs(counts[q(f"q{i}")] - expected) <= 5 * sigma + 10, (weights, counts)


def test_jump_hash_moves_only_to_new_buckets():
    keys = range(5000)
    before = [jump_hash(k * 7919 + 1, 10) for k in keys]
    after = [jump_hash(k * 7919 + 1, 11) for k in keys]
    moved = [(b, a) for b, a in zip(before, after) if b != a]
    assert all(a == 10 for _, a in moved)          # a key moves only to the new bucket
    assert 300 < len(moved) < 700                  # about 1/11 of them


def test_same_key_same_destination_and_ring_after_unbind():
    index = ConsistentHashIndex(None)
    for name, w in (("a", "1"), ("b", "2"), ("c", "3")):
        index.bind(q(name), w)
    assert index.weights() == {q("a"): 1, q("b"): 2, q("c"): 3}
    picks = {k: index.match(k)[0] for k in map(str, range(300))}
    assert all(index.match(k)[0] == d for k, d in picks.items())
    assert index.unbind(q("b"), "2")
    assert index.weights() == {q("a"): 1, q("c"): 3}
    assert {index.match(k)[0] for k in picks} == {q("a"), q("c")}


def test_second_binding_of_a_destination_keeps_the_first_weight():
    index = ConsistentHashIndex(None)
    index.bind(q("a"), "5")
    index.bind(q("a"), "7")      # stored as a binding, but the ring keeps weight 5 (as the plugin)
    index.bind(q("b"), "5")
    assert len(index) == 3 and index.weights() == {q("a"): 5, q("b"): 5}
    index.unbind(q("a"), "5")
    assert index.weights() == {q("b"): 5, q("a"): 7}


@pytest.mark.parametrize("key, text", [("0", "greater than 0"), ("10001", "must not exceed 10000"),
                                       ("abc", "must be an integer"), ("", "must be an integer")])
def test_consistent_hash_binding_key_must_be_a_weight(key, text):
    with pytest.raises(ValueError, match=text):
        ConsistentHashIndex(None).bind(q("a"), key)


def test_hash_arguments():
    assert hash_on({}) is None
    assert hash_on({"hash-header": "h"}) == ("header", "h")
    assert hash_on({"hash-property": b"message_id"}) == ("property", "message_id")
    with pytest.raises(routing.InvalidExchangeArguments, match="mutually exclusive"):
        hash_on({"hash-header": "h", "hash-property": "message_id"})
    with pytest.raises(routing.InvalidExchangeArguments, match="Unsupported property: app_id"):
        hash_on({"hash-property": "app_id"})


def test_hash_header_and_property():
    by_header = ConsistentHashIndex(("header", "h"))
    by_prop = ConsistentHashIndex(("property", "timestamp"))
    for i in range(8):
        by_header.bind(q(f"q{i}"), "10")
        by_prop.bind(q(f"q{i}"), "10")
    # the routing key does not matter, the header does
    assert {by_header.match(f"rk{i}", {"h": "same"})[0] for i in range(50)} == {by_header.match("x", {"h": "same"})[0]}
    assert len({by_header.match("rk", {"h": f"v{i}"})[0] for i in range(200)}) == 8
    # missing header: one fixed destination
    assert len({by_header.match(f"rk{i}", {})[0] for i in range(50)}) == 1
    # timestamp hashed in seconds
    t1 = datetime(2026, 1, 1, 0, 0, 0, tzinfo=timezone.utc)
    fields = routing.RoutingFields(None, {"timestamp": t1})
    assert by_prop.match("a", fields) == by_prop.match("b", fields)
    spread = {by_prop.match("a", routing.RoutingFields(None, {"timestamp": datetime.fromtimestamp(
        1_700_000_000 + s, timezone.utc)}))[0] for s in range(200)}
    assert len(spread) == 8


def test_modulus_hash_one_destination_stable_by_sorted_order():
    a, b = ModulusHashIndex(), ModulusHashIndex()
    names = [f"q{i}" for i in range(5)]
    for n in names:
        a.bind(q(n), "ignored")
    for n in reversed(names):
        b.bind(q(n), "")
    for k in map(str, range(200)):
        assert a.match(k) == b.match(k) and len(a.match(k)) == 1
    assert len({a.match(str(k))[0] for k in range(200)}) == 5
    assert a.destinations()[0] == q("q0")
    b.bind(("e", "zz"), "")
    assert b.destinations()[0] == ("e", "zz")   # exchanges sort before queues, as RabbitMQ


class _Queue:
    def __init__(self, kind="classic", remote=False):
        self.queue_type = kind
        self.remote = remote


def test_local_random_binding_rules_and_picks():
    queues = {"a": _Queue(), "b": _Queue(), "qq": _Queue("quorum"), "far": _Queue(remote=True)}
    index = LocalRandomIndex(random.Random(7))
    index.attach(queues)
    with pytest.raises(ValueError, match="Non empty binding 'k' key not permitted"):
        index.bind(q("a"), "k")
    with pytest.raises(ValueError, match="Destination not found"):
        index.bind(("e", "x"), "")
    with pytest.raises(ValueError, match="Queue type quorum not valid"):
        index.bind(q("qq"), "")
    for n in ("a", "b", "far"):
        index.bind(q(n), "")
    picks = Counter(index.match("")[0] for _ in range(1000))
    assert set(picks) == {q("a"), q("b")}                 # never the queue another node leads
    assert min(picks.values()) > 350
    index.unbind(q("a"), "")
    index.unbind(q("b"), "")
    assert index.match("") == []                          # only a remote queue left: unroutable
