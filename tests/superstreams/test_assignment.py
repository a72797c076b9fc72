"""The group assignment (queue_types/group_partitions.assign) over random joins and leaves:
every partition has exactly one owner among the members, counts differ by at most one, and a
rebalance moves no more partitions than evenness needs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from exchange_broker.queue_types.group_partitions import assign


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=30))
def test_even_exact_and_sticky(partitions, events):
    members: list[str] = []
    current: dict = {p: None for p in range(partitions)}
    made = 0
    for join, pick in events:
        if join or not members:
            made += 1
            members.append(f"m{made}")
        else:
            members.pop(pick % len(members))
        new = assign(partitions, members, current)
        assert set(new) == set(range(partitions))
        if not members:
            assert set(new.values()) == {None}
            current = new
            continue
        assert all(new[p] in members for p in range(partitions))
        counts = [sum(1 for p in new if new[p] == m) for m in members]
        assert max(counts) - min(counts) <= 1
        # sticky: a partition moves only if its owner left or held more than its share
        base, extra = divmod(partitions, len(members))
        held = {m: sum(1 for p in current if current[p] == m) for m in members}
        must_move = sum(1 for p in current if current[p] not in members)
        must_move += sum(max(0, h - (base + 1)) for h in held.values())
        over = sorted((h for h in held.values() if h > base), reverse=True)
        must_move += sum(h - base for h in over[extra:])   # only `extra` members may keep base+1
        moved = sum(1 for p in new if current[p] is not None and current[p] != new[p])
        assert moved <= must_move
        current = new


def test_no_members_no_owner():
    assert assign(3, [], {0: "a"}) == {0: None, 1: None, 2: None}
