"""Consumer groups on a super stream with pika: 3 partitions, 300 routing keys, 3,000 confirmed
messages; members split the partitions, every key stays at one member in publish order, a
joining member takes partitions without any offset going out twice, a dead member's partitions
move with nothing lost, and a group started again resumes after what it acked."""

from __future__ import annotations

from routing.super_stream import partition_of

from eb_support import uniq
from ss_helpers import (TOTAL, Member, check_order, connect, declare, key_of, kill_socket,
                        one_partition_per_key, publish, run_until)


def _setup(port: int) -> tuple:
    conn = connect(port)
    name = uniq("ss")
    ch = conn.channel()
    declare(ch, name)
    publish(ch, name)
    return conn, name


def test_two_members_then_a_third_joins(broker):
    conn = connect(broker.port)
    name = uniq("ss")
    ch = conn.channel()
    declare(ch, name)
    half = TOTAL // 2
    publish(ch, name, total=half)
    a = Member(broker.port, name, "billing", prefetch=20)
    b = Member(broker.port, name, "billing", prefetch=20)
    members = [a, b]
    run_until(members, lambda: len(a.got) + len(b.got) >= 900)
    assert a.got and b.got
    c = Member(broker.port, name, "billing", prefetch=20)
    members.append(c)
    # the second half is published once c is in (a and b may well have read all of the first):
    # c's partitions hold a third of it
    publish(ch, name, total=TOTAL - half, start=half)
    run_until(members, lambda: sum(len(m.got) for m in members) >= TOTAL)
    items = [x for m in members for x in m.got]
    # every message once: no (partition, offset) went to two members, none is missing
    assert len(items) == TOTAL
    assert len({(p, o) for _, p, o in items}) == TOTAL
    assert sorted(i for i, _, _ in items) == list(range(TOTAL))
    assert c.got, "the member that joined got a partition"
    check_order(members)
    one_partition_per_key(items)
    # the partition is murmur3(key) mod 3 (seed 104729), the documented stable hash
    assert all(p == partition_of(key_of(i), 3) for i, p, _ in items)
    # offsets per partition: 0..n-1, each delivered once
    for p in range(3):
        offs = sorted(o for _, q, o in items if q == p)
        assert offs == list(range(len(offs)))
    for m in members:
        m.close()
    conn.close()


def test_killed_member_partitions_move_nothing_lost(broker):
    conn, name = _setup(broker.port)
    a = Member(broker.port, name, "billing", prefetch=50)
    b = Member(broker.port, name, "billing", prefetch=50, ack_limit=200)
    run_until([a, b], lambda: len(b.got) >= 250)   # b holds 50 deliveries it will never ack
    unacked_at_b = {i for i, _, _ in b.got[200:]}
    a_before = len(a.acked)
    kill_socket(b)
    run_until([a], lambda: len({i for i, _, _ in a.acked + b.acked}) >= TOTAL)
    acked = a.acked + b.acked
    assert len(acked) == TOTAL                       # nothing acked twice, nothing lost
    assert sorted(i for i, _, _ in acked) == list(range(TOTAL))
    assert unacked_at_b <= {i for i, _, _ in a.acked}  # b's unacked ones went to a
    for m in (a, b):
        m.got = m.acked
    check_order([a, b])
    # per key, what a acked after b died comes after everything b acked of that key
    last_b = {key_of(i): i for i, _, _ in b.acked}
    assert all(i > last_b[key_of(i)] for i, _, _ in a.acked[a_before:] if key_of(i) in last_b)
    a.close()
    b.close()
    conn.close()


def test_restarted_group_resumes_and_second_group_reads_all(broker):
    conn, name = _setup(broker.port)
    a = Member(broker.port, name, "billing", prefetch=50, ack_limit=1000)
    run_until([a], lambda: len(a.got) >= 1050)
    a.close()                                        # 50 unacked go back
    acked = {i for i, _, _ in a.acked}
    again = Member(broker.port, name, "billing", prefetch=50)
    run_until([again], lambda: len(again.got) >= TOTAL - 1000)
    got = [i for i, _, _ in again.got]
    assert len(got) == TOTAL - 1000
    assert set(got) == set(range(TOTAL)) - acked     # only what it had not acked
    other = Member(broker.port, name, "audit", prefetch=100)
    run_until([again, other], lambda: len(other.got) >= TOTAL)
    assert sorted(i for i, _, _ in other.got) == list(range(TOTAL))
    assert len(again.got) == TOTAL - 1000            # the first group got nothing more
    again.close()
    other.close()
    conn.close()


def test_group_resumes_across_broker_restart(broker_process):
    proc = broker_process()
    conn, name = _setup(proc.port)
    a = Member(proc.port, name, "billing", prefetch=50, ack_limit=1000)
    run_until([a], lambda: len(a.got) >= 1050)
    acked = {i for i, _, _ in a.acked}
    # a graceful stop with the member still connected (its 50 unacked go back, its acks stay)
    proc.terminate(pump=lambda: (a.conn.process_data_events(0.01), conn.process_data_events(0)))
    a.close()
    proc = broker_process()
    again = Member(proc.port, name, "billing", prefetch=50)
    run_until([again], lambda: len(again.got) >= TOTAL - 1000)
    assert sorted(i for i, _, _ in again.got) == sorted(set(range(TOTAL)) - acked)
    # the partitions and their routing survived: a key published now lands where it did before
    conn = connect(proc.port)
    publish(conn.channel(), name, total=300, start=TOTAL)
    other = Member(proc.port, name, "audit", prefetch=100)
    run_until([again, other], lambda: len(other.got) >= TOTAL + 300)
    assert sorted(i for i, _, _ in other.got) == list(range(TOTAL + 300))
    one_partition_per_key(other.got)
    for m in (again, other):
        m.close()
    conn.close()
