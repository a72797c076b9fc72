"""Topic exchange index: a word trie with ``*`` (one word) and ``#`` (zero or more)."""
from __future__ import annotations

from .base import BindingKey, BindingTable, Dest
from .types import ExchangeType

CACHE_SIZE = 10_000


def split_words(key: str) -> list[str]:
    """Split on "." the RabbitMQ way: "" is zero words, "a." is ["a", ""]."""
    return key.split(".") if key else []


class _Node:
    __slots__ = ("children", "ends", "is_hash")

    def __init__(self, is_hash: bool = False) -> None:
        self.children: dict[str, _Node] = {}
        self.ends: dict[BindingKey, tuple[int, Dest]] = {}  # binding -> (seq, dest)
        self.is_hash = is_hash


class TopicIndex(BindingTable):
    """Topic matching over a trie; each (node, word position) is visited once."""

    def __init__(self) -> None:
        super().__init__()
        self._root = _Node()
        self._seq = 0
        self._cache: dict[str, list[Dest]] = {}

    def _added(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        node = self._root
        for word in split_words(routing_key):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node(word == "#")
            node = child
        self._seq += 1
        node.ends[key] = (self._seq, dest)
        self._cache.clear()

    def _removed(self, key: BindingKey, dest: Dest, routing_key: str, args: dict) -> None:
        path = [(self._root, "")]
        for word in split_words(routing_key):
            path.append((path[-1][0].children[word], word))
        del path[-1][0].ends[key]
        for i in range(len(path) - 1, 0, -1):
            node, word = path[i]
            if node.children or node.ends:
                break
            del path[i - 1][0].children[word]
        self._cache.clear()

    def match(self, routing_key: str, headers: dict | None = None) -> list[Dest]:
        """Matching destinations in binding order; the list is cached, do not mutate."""
        cache = self._cache
        result = cache.get(routing_key)
        if result is None:
            result = self._compute(routing_key)
            if len(cache) >= CACHE_SIZE:
                del cache[next(iter(cache))]
            cache[routing_key] = result
        return result

    def _compute(self, routing_key: str) -> list[Dest]:
        words = split_words(routing_key)
        n = len(words)
        found: dict[BindingKey, tuple[int, Dest]] = {}
        seen: set[tuple[_Node, int]] = set()
        stack = [(self._root, 0)]
        while stack:
            state = stack.pop()
            if state in seen:
                continue
            seen.add(state)
            node, i = state
            children = node.children
            if i == n:
                if node.ends:
                    found.update(node.ends)
            else:
                if node.is_hash:  # "#" swallows one more word
                    stack.append((node, i + 1))
                child = children.get(words[i])
                if child is not None:
                    stack.append((child, i + 1))
                child = children.get("*")
                if child is not None:
                    stack.append((child, i + 1))
            child = children.get("#")  # "#" matching zero words
            if child is not None:
                stack.append((child, i))
        if not found:
            return []
        return list(dict.fromkeys(dest for _, dest in sorted(found.values(), key=_first)))


def _first(entry: tuple[int, Dest]) -> int:
    return entry[0]


class TopicType(ExchangeType):
    name = "topic"
    index_class = TopicIndex
