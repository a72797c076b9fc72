"""TopicIndex: table of RabbitMQ word-splitting cases plus a property test."""
import pytest
from hypothesis import given, settings, strategies as st

from routing import TopicIndex
from routing import topic as topic_mod
from routing.topic import split_words

Q = ("q", "q")

CASES = [
    # (binding key, routing key, matches)
    ("a.b", "a.b", True),
    ("a.b", "a.c", False),
    ("a.*", "a.b", True),
    ("a.*", "a.b.c", False),
    ("a.*", "a", False),
    ("a.*", "a.", True),  # "*" matches the empty word
    ("*.a", ".a", True),
    ("a..b", "a..b", True),
    ("a.*.b", "a..b", True),
    ("a.b", "a..b", False),
    ("a..b", "a.b", False),
    ("", "", True),
    ("", "a", False),
    ("", ".", False),
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("#", ".", True),
    ("*", "", False),
    ("*", "a", True),
    ("*", ".", False),
    ("*.*", ".", True),
    ("#.a", "a", True),
    ("#.a", "b.a", True),
    ("#.a", "a.b", False),
    ("a.#", "a", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b", False),
    ("a.#", "", False),
    ("*.#", "", False),
    ("*.#", "a", True),
    ("*.#", "a.b", True),
    ("#.*", "", False),
    ("#.#", "", True),
    ("#.#", "a.b", True),
    ("a.#.#.b", "a.b", True),
    ("a.#.#.b", "a.x.y.b", True),
    ("a.#.#.b", "a.x.y.c", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.c.d.b", True),
    ("a.#.b", "a.b.c", False),
    ("a.#.b.#", "a.x.b.y.z", True),
    ("#.b.#", "b", True),
    ("#.b.#", "a.c", False),
    ("a.b.c", "a.b", False),
    ("a.b", "a.b.c", False),
    ("A", "a", False),
]


@pytest.mark.parametrize("binding,rk,expected", CASES)
def test_topic_table(binding, rk, expected):
    idx = TopicIndex()
    idx.bind(Q, binding, None)
    assert (idx.match(rk, None) == [Q]) is expected


def test_split_words():
    assert split_words("") == []
    assert split_words("a.") == ["a", ""]
    assert split_words(".a") == ["", "a"]
    assert split_words("a..b") == ["a", "", "b"]
    assert split_words(".") == ["", ""]


def test_dedup_and_binding_order():
    idx = TopicIndex()
    q1, q2, q3 = ("q", "1"), ("q", "2"), ("e", "3")
    idx.bind(q2, "#", None)
    idx.bind(q1, "a.*", None)
    idx.bind(q2, "a.b", None)
    idx.bind(q3, "*.b", None)
    idx.bind(q1, "a.b", {"x": 1})
    assert idx.match("a.b", None) == [q2, q1, q3]
    assert idx.match("c.d", None) == [q2]
    idx.unbind(q2, "#", None)
    assert idx.match("a.b", None) == [q1, q2, q3]  # cache invalidated, order by remaining bindings
    assert idx.match("c.d", None) == []
    assert idx.remove_destination(q1) == 2
    assert idx.match("a.b", None) == [q2, q3]


def test_unbind_prunes_trie():
    idx = TopicIndex()
    idx.bind(Q, "a.b.c", None)
    idx.bind(Q, "a.#", None)
    idx.unbind(Q, "a.b.c", None)
    assert list(idx._root.children) == ["a"]
    assert list(idx._root.children["a"].children) == ["#"]
    idx.unbind(Q, "a.#", None)
    assert idx._root.children == {}
    assert idx.match("a.b.c", None) == []


def test_shared_prefix_unbind_keeps_sibling():
    idx = TopicIndex()
    idx.bind(("q", "1"), "a.b", None)
    idx.bind(("q", "2"), "a.b.c", None)
    idx.unbind(("q", "1"), "a.b", None)
    assert idx.match("a.b.c", None) == [("q", "2")]
    assert idx.match("a.b", None) == []


def test_many_hashes_do_not_blow_up():
    idx = TopicIndex()
    idx.bind(Q, ".".join(["#"] * 30) + ".z", None)
    assert idx.match(".".join(["a"] * 60), None) == []
    assert idx.match(".".join(["a"] * 60) + ".z", None) == [Q]


def test_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(topic_mod, "CACHE_SIZE", 5)
    idx = TopicIndex()
    idx.bind(Q, "#", None)
    for i in range(20):
        assert idx.match(f"k{i}", None) == [Q]
    assert len(idx._cache) <= 5


# --- property test against a reference matcher --------------------------------

def ref_match(pattern: list[str], words: list[str]) -> bool:
    """Straight recursive definition of topic matching."""
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(ref_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and ref_match(rest, words[1:])


pattern_words = st.lists(st.sampled_from(["a", "b", "", "*", "#"]), max_size=6)
key_words = st.lists(st.sampled_from(["a", "b", ""]), max_size=7)


def join(words: list[str]) -> str:
    return ".".join(words)


@settings(max_examples=300, deadline=None)
@given(patterns=st.lists(pattern_words, max_size=8), keys=st.lists(key_words, min_size=1, max_size=5))
def test_topic_matches_reference(patterns, keys):
    idx = TopicIndex()
    dests = []
    for i, p in enumerate(patterns):
        d = ("q", f"q{i % 4}")
        idx.bind(d, join(p), None)
        dests.append((d, split_words(join(p))))
    for k in keys:
        rk = join(k)
        words = split_words(rk)
        expected = list(dict.fromkeys(d for d, p in dests if ref_match(p, words)))
        assert idx.match(rk, None) == expected
    # unbinding half the patterns keeps results consistent
    for i, p in enumerate(patterns[::2]):
        idx.unbind(("q", f"q{(2 * i) % 4}"), join(p), None)
    remaining = [(("q", f"q{i % 4}"), split_words(join(p))) for i, p in enumerate(patterns)]
    removed = {(("q", f"q{(2 * i) % 4}"), join(p)) for i, p in enumerate(patterns[::2])}
    remaining = [(d, p) for d, p in remaining if (d, join(p)) not in removed]
    for k in keys:
        words = split_words(join(k))
        expected = list(dict.fromkeys(d for d, p in remaining if ref_match(p, words)))
        assert idx.match(join(k), None) == expected
