"""route(): exchange-to-exchange chains, cycles, alternate exchanges, dedup."""
from dataclasses import dataclass

from routing import DefaultIndex, make_index, route


@dataclass
class Exchange:
    index: object
    alternate_exchange: str | None = None


class World:
    def __init__(self):
        self.exchanges: dict[str, Exchange] = {}
        self.calls: list[str] = []

    def add(self, name, kind="direct", ae=None):
        self.exchanges[name] = Exchange(make_index(kind), ae)
        return self.exchanges[name].index

    def lookup(self, name):
        self.calls.append(name)
        return self.exchanges.get(name)

    def route(self, name, rk="", headers=None):
        return route(self.lookup, name, rk, headers)


def test_unknown_exchange():
    assert World().route("nope", "k") == []


def test_fast_path_direct():
    w = World()
    x = w.add("x")
    x.bind(("q", "a"), "k", None)
    x.bind(("q", "b"), "k", None)
    assert w.route("x", "k") == ["a", "b"]
    assert w.route("x", "other") == []


def test_default_exchange():
    w = World()
    w.exchanges[""] = Exchange(DefaultIndex({"q1"}.__contains__))
    assert w.route("", "q1") == ["q1"]
    assert w.route("", "q2") == []


def test_exchange_chain_and_dedup():
    w = World()
    top = w.add("top", "fanout")
    mid = w.add("mid", "topic")
    leaf = w.add("leaf", "headers")
    top.bind(("q", "q1"), "", None)
    top.bind(("e", "mid"), "", None)
    top.bind(("q", "q2"), "", None)
    mid.bind(("q", "q3"), "a.*", None)
    mid.bind(("e", "leaf"), "#", None)
    mid.bind(("q", "q1"), "#", None)
    leaf.bind(("q", "q4"), "", {"h": 1})
    leaf.bind(("q", "q2"), "", {"h": 1})
    assert w.route("top", "a.b", {"h": 1}) == ["q1", "q3", "q4", "q2"]
    assert w.route("top", "z", {"h": 2}) == ["q1", "q2"]
    assert w.route("mid", "a.b", None) == ["q3", "q1"]


def test_cycles_terminate():
    w = World()
    a = w.add("a", "fanout")
    b = w.add("b", "fanout")
    a.bind(("e", "b"), "", None)
    a.bind(("e", "a"), "", None)  # self-binding
    b.bind(("e", "a"), "", None)
    b.bind(("q", "qb"), "", None)
    a.bind(("q", "qa"), "", None)
    assert w.route("a") == ["qb", "qa"]
    assert w.route("b") == ["qa", "qb"]  # b -> a (-> qa) first, then qb
    assert w.calls.count("a") == 2 and w.calls.count("b") == 2  # one lookup per route each


def test_missing_destination_exchange_skipped():
    w = World()
    x = w.add("x", "fanout")
    x.bind(("e", "gone"), "", None)
    x.bind(("q", "q"), "", None)
    assert w.route("x") == ["q"]


def test_alternate_exchange():
    w = World()
    x = w.add("x", "direct", ae="ae")
    ae = w.add("ae", "fanout")
    x.bind(("q", "hit"), "k", None)
    ae.bind(("q", "unrouted"), "", None)
    assert w.route("x", "k") == ["hit"]
    assert w.route("x", "miss") == ["unrouted"]


def test_alternate_exchange_not_used_when_binding_to_empty_exchange():
    # x matched (an exchange destination), so its AE is not consulted even
    # though nothing was ultimately reached; the empty inner exchange's AE is.
    w = World()
    x = w.add("x", "fanout", ae="ae1")
    inner = w.add("inner", "direct", ae="ae2")
    w.add("ae1", "fanout").bind(("q", "from-ae1"), "", None)
    w.add("ae2", "fanout").bind(("q", "from-ae2"), "", None)
    x.bind(("e", "inner"), "", None)
    assert w.route("x", "k") == ["from-ae2"]
    inner.bind(("q", "direct"), "k", None)
    assert w.route("x", "k") == ["direct"]


def test_alternate_exchange_chain_and_cycle():
    w = World()
    w.add("x", "direct", ae="ae1")
    w.add("ae1", "direct", ae="ae2")
    ae2 = w.add("ae2", "direct", ae="x")  # loops back
    assert w.route("x", "k") == []
    ae2.bind(("q", "last"), "k", None)
    assert w.route("x", "k") == ["last"]
    w.add("self", "direct", ae="self")
    assert w.route("self", "k") == []


def test_missing_alternate_exchange():
    w = World()
    w.add("x", "direct", ae="nowhere")
    assert w.route("x", "k") == []


def test_alternate_of_nested_exchange_with_cycle_to_start():
    w = World()
    a = w.add("a", "fanout")
    w.add("b", "direct", ae="a")  # b's AE is a, already visited
    a.bind(("e", "b"), "", None)
    a.bind(("q", "qa"), "", None)
    assert w.route("a", "k") == ["qa"]


def test_deep_chain_no_recursion_limit():
    w = World()
    n = 3000
    for i in range(n):
        w.add(f"x{i}", "fanout").bind(("e", f"x{i + 1}"), "", None)
    w.add(f"x{n}", "fanout").bind(("q", "end"), "", None)
    assert w.route("x0") == ["end"]
