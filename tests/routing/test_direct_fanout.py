"""DirectIndex, FanoutIndex, DefaultIndex, make_index and binding identity."""
import pytest

from routing import DefaultIndex, DirectIndex, FanoutIndex, HeadersIndex, TopicIndex, args_key, make_index

Q1, Q2, Q3, E1 = ("q", "q1"), ("q", "q2"), ("q", "q3"), ("e", "x1")


@pytest.mark.parametrize("cls", [DirectIndex, FanoutIndex, TopicIndex, HeadersIndex])
def test_common_binding_table_behaviour(cls):
    idx = cls()
    assert len(idx) == 0 and idx.bindings() == []
    assert idx.bind(Q1, "k", None) is True
    assert idx.bind(Q1, "k", {}) is False  # None and {} are the same arguments
    assert idx.bind(Q1, "k", {"a": 1}) is True  # different args: new binding
    assert idx.bind(Q1, "k", {"a": True}) is True  # bool is not int
    assert idx.bind(Q2, "k", None) is True
    assert idx.bind(E1, "j", None) is True
    assert len(idx) == 5
    assert idx.bindings() == [
        (Q1, "k", {}), (Q1, "k", {"a": 1}), (Q1, "k", {"a": True}), (Q2, "k", {}), (E1, "j", {}),
    ]
    assert idx.has_destination(Q1) and idx.has_destination(E1) and not idx.has_destination(Q3)
    assert idx.unbind(Q1, "k", {"a": 1}) is True
    assert idx.unbind(Q1, "k", {"a": 1}) is False
    assert idx.unbind(Q3, "k", None) is False
    assert idx.remove_destination(Q1) == 2
    assert idx.remove_destination(Q1) == 0
    assert not idx.has_destination(Q1)
    assert idx.bindings() == [(Q2, "k", {}), (E1, "j", {})]
    assert len(idx) == 2


def test_args_identity_is_canonical():
    a = {"x": {"b": [1, b"z", None], "a": 2.5}, "y": "s"}
    b = {"y": "s", "x": {"a": 2.5, "b": [1, b"z", None]}}
    assert args_key(a) == args_key(b)
    hash(args_key(a))
    assert args_key({"x": 1}) != args_key({"x": "1"})
    assert args_key({"x": 1}) != args_key({"x": 1.0})
    assert args_key({"x": b"a"}) != args_key({"x": "a"})
    idx = DirectIndex()
    assert idx.bind(Q1, "k", a)
    assert not idx.bind(Q1, "k", b)
    assert idx.unbind(Q1, "k", b)


def test_bind_copies_arguments():
    idx = DirectIndex()
    args = {"a": 1}
    idx.bind(Q1, "k", args)
    args["a"] = 2
    assert idx.bindings() == [(Q1, "k", {"a": 1})]
    assert idx.unbind(Q1, "k", {"a": 1})


def test_direct_match():
    idx = DirectIndex()
    idx.bind(Q2, "k", None)
    idx.bind(Q1, "k", None)
    idx.bind(Q1, "k", {"a": 1})
    idx.bind(E1, "k", None)
    idx.bind(Q3, "other", None)
    idx.bind(Q3, "", None)
    assert idx.match("k", None) == [Q2, Q1, E1]
    assert idx.match("other", {"h": 1}) == [Q3]
    assert idx.match("", None) == [Q3]
    assert idx.match("K", None) == []
    assert idx.match("k.x", None) == []
    idx.unbind(Q1, "k", None)
    assert idx.match("k", None) == [Q2, Q1, E1]  # Q1 still bound with args
    idx.unbind(Q1, "k", {"a": 1})
    assert idx.match("k", None) == [Q2, E1]
    idx.remove_destination(Q3)
    assert idx.match("other", None) == [] and idx.match("", None) == []
    assert idx.match("nothing", None) is not idx.match("nothing", None)  # misses are fresh lists


def test_direct_match_follows_binding_order_after_unbind():
    idx = DirectIndex()
    idx.bind(Q1, "k", None)
    idx.bind(Q2, "k", None)
    idx.bind(Q1, "k", {"a": 1})
    idx.unbind(Q1, "k", None)
    assert idx.match("k", None) == [Q2, Q1]


def test_fanout_match():
    idx = FanoutIndex()
    assert idx.match("any", None) == []
    idx.bind(Q2, "a", None)
    idx.bind(Q1, "b", None)
    idx.bind(Q2, "c", None)
    idx.bind(E1, "", None)
    assert idx.match("zzz", None) == [Q2, Q1, E1]
    assert idx.match("", {"x": 1}) == [Q2, Q1, E1]
    idx.unbind(Q2, "a", None)
    assert idx.match("", None) == [Q1, Q2, E1]
    assert idx.remove_destination(Q2) == 1
    assert idx.match("", None) == [Q1, E1]
    idx.bind(Q2, "a", None)
    assert idx.match("", None) == [Q1, E1, Q2]


def test_make_index():
    assert isinstance(make_index("direct"), DirectIndex)
    assert isinstance(make_index("fanout"), FanoutIndex)
    assert isinstance(make_index("topic"), TopicIndex)
    assert isinstance(make_index("headers"), HeadersIndex)
    assert make_index("direct") is not make_index("direct")
    with pytest.raises(ValueError):
        make_index("x-no-such-type")


def test_default_index():
    queues = {"a", "b"}
    idx = DefaultIndex(queues.__contains__)
    assert idx.match("a", None) == [("q", "a")]
    assert idx.match("c", None) == []
    queues.add("c")
    assert idx.match("c", None) == [("q", "c")]
    with pytest.raises(ValueError):
        idx.bind(Q1, "a", None)
    with pytest.raises(ValueError):
        idx.unbind(Q1, "a", None)
    assert len(idx) == 0 and idx.bindings() == [] and idx.remove_destination(Q1) == 0
    assert not idx.has_destination(("q", "a"))


def test_routing_has_no_forbidden_imports():
    import subprocess
    import sys

    code = (
        "import sys, routing, routing.route, routing.topic, routing.headers;"
        "bad = [m for m in ('asyncio', 'pamqp', 'sqlalchemy') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
