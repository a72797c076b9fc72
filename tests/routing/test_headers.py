"""HeadersIndex: x-match modes, typed equality, void values, property test."""
from decimal import Decimal

import pytest
from hypothesis import given, settings, strategies as st

from routing import HeadersIndex
from routing.headers import values_equal

Q = ("q", "q")


def matches(args, headers) -> bool:
    idx = HeadersIndex()
    idx.bind(Q, "ignored", args)
    return idx.match("whatever", headers) == [Q]


@pytest.mark.parametrize(
    "args,headers,expected",
    [
        ({"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, True),  # x-match defaults to all
        ({"a": 1, "b": 2}, {"a": 1}, False),
        ({"x-match": "all", "a": 1, "b": 2}, {"a": 1, "b": 3}, False),
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 1, "b": 3}, True),
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 0, "c": 2}, False),
        # x- keys ignored with all/any ...
        ({"x-match": "all", "x-foo": 1, "a": 1}, {"a": 1}, True),
        ({"x-match": "any", "x-foo": 1}, {"x-foo": 1}, False),
        # ... but considered with -with-x (x-match itself never is)
        ({"x-match": "all-with-x", "x-foo": 1, "a": 1}, {"a": 1}, False),
        ({"x-match": "all-with-x", "x-foo": 1, "a": 1}, {"a": 1, "x-foo": 1}, True),
        ({"x-match": "any-with-x", "x-foo": 1, "a": 1}, {"x-foo": 1}, True),
        ({"x-match": "any-with-x", "x-foo": 1}, {"x-foo": 2}, False),
        # vacuous cases
        ({}, {}, True),
        ({}, None, True),
        ({"x-match": "all"}, {"a": 1}, True),
        ({"x-match": "all", "x-foo": 1}, {}, True),
        ({"x-match": "any"}, {"a": 1}, False),
        ({"x-match": "any-with-x"}, {"x-match": "any-with-x"}, False),
        ({"x-match": "all-with-x"}, None, True),
        # void binding value = presence test
        ({"a": None}, {"a": "anything"}, True),
        ({"a": None}, {"a": None}, True),
        ({"a": None}, {"b": 1}, False),
        ({"a": None}, None, False),
        ({"x-match": "any", "a": None, "b": 1}, {"a": 5}, True),
        # a void header value does not equal a non-void binding value
        ({"a": 1}, {"a": None}, False),
        # typed comparisons
        ({"a": True}, {"a": 1}, False),
        ({"a": 1}, {"a": True}, False),
        ({"a": False}, {"a": 0}, False),
        ({"a": True}, {"a": True}, True),
        ({"a": 1}, {"a": "1"}, False),
        ({"a": "1"}, {"a": 1}, False),
        ({"a": "x"}, {"a": b"x"}, True),
        ({"a": b"x"}, {"a": "x"}, True),
        ({"a": b"\xff"}, {"a": "\xff"}, False),
        ({"a": b"\xff"}, {"a": b"\xff"}, True),
        ({"a": 1}, {"a": 1.0}, True),  # numbers compare by value like Erlang ==
        ({"a": Decimal("1.5")}, {"a": 1.5}, True),
        ({"a": {"n": [1, "s"]}}, {"a": {"n": [1, b"s"]}}, True),
        ({"a": {"n": [1, "s"]}}, {"a": {"n": [True, "s"]}}, False),
        ({"a": [1]}, {"a": [1, 2]}, False),
    ],
)
def test_headers_cases(args, headers, expected):
    assert matches(args, headers) is expected


def test_x_match_as_bytes():
    assert matches({"x-match": b"any", "a": 1, "b": 2}, {"b": 2})


@pytest.mark.parametrize("bad", ["none", "ALL", "", 1, None, b"\xff", True])
def test_invalid_x_match(bad):
    idx = HeadersIndex()
    with pytest.raises(ValueError, match="invalid x-match"):
        idx.bind(Q, "", {"x-match": bad, "a": 1})
    assert len(idx) == 0 and not idx.has_destination(Q)


def test_routing_key_ignored_and_dedup_order():
    idx = HeadersIndex()
    q1, q2 = ("q", "1"), ("q", "2")
    idx.bind(q2, "k1", {"a": 1})
    idx.bind(q1, "k2", {"b": 1})
    idx.bind(q2, "k3", {"b": 1})
    assert idx.bind(q1, "k2", {"b": 1}) is False
    assert idx.match("nothing", {"a": 1, "b": 1}) == [q2, q1]
    assert idx.match("", {"b": 1}) == [q1, q2]
    idx.unbind(q2, "k3", {"b": 1})
    assert idx.match("", {"b": 1}) == [q1]
    assert idx.remove_destination(q2) == 1
    assert idx.match("", {"a": 1, "b": 1}) == [q1]


def test_values_equal_basics():
    assert values_equal("a", "a")
    assert not values_equal(True, 1)
    assert values_equal(b"a", "a") and values_equal("a", bytearray(b"a"))
    assert not values_equal(None, 0)
    assert not values_equal({"a": 1}, [1])


# --- property test against a reference ------------------------------------------

KEYS = ["a", "b", "c", "x-a", "x-match"]
VALUES = [None, True, False, 0, 1, "1", "s", b"s", b"\xff", 1.0]


def ref_equal(want, got) -> bool:
    def norm(v):
        if isinstance(v, bytes):
            try:
                return ("str", v.decode())
            except UnicodeDecodeError:
                return ("bytes", v)
        if isinstance(v, bool):
            return ("bool", v)
        if isinstance(v, (int, float)):
            return ("num", v)
        if isinstance(v, str):
            return ("str", v)
        return ("void", None)

    return norm(want) == norm(got)


def ref_headers_match(args: dict, headers: dict) -> bool:
    mode = args.get("x-match", "all")
    with_x = mode.endswith("-with-x")
    considered = {
        k: v for k, v in args.items() if k != "x-match" and (with_x or not k.startswith("x-"))
    }
    results = [
        k in headers and (v is None or ref_equal(v, headers[k])) for k, v in considered.items()
    ]
    return all(results) if mode.startswith("all") else any(results)


modes = st.sampled_from([None, "all", "any", "all-with-x", "any-with-x"])
plain_keys = st.sampled_from([k for k in KEYS if k != "x-match"])
values = st.sampled_from(VALUES)
header_dicts = st.dictionaries(st.sampled_from(KEYS), values, max_size=5)


@st.composite
def bindings(draw):
    args = draw(st.dictionaries(plain_keys, values, max_size=4))
    mode = draw(modes)
    if mode is not None:
        args["x-match"] = mode
    return args


@settings(max_examples=300, deadline=None)
@given(binds=st.lists(bindings(), max_size=6), messages=st.lists(header_dicts, min_size=1, max_size=4))
def test_headers_match_reference(binds, messages):
    idx = HeadersIndex()
    for i, args in enumerate(binds):
        idx.bind(("q", f"q{i % 3}"), "", args)
    for headers in messages:
        expected = list(
            dict.fromkeys(("q", f"q{i % 3}") for i, a in enumerate(binds) if ref_headers_match(a, headers))
        )
        assert idx.match("", headers) == expected
