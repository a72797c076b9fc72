"""Consumer groups with aio-pika: 3 partitions, 300 keys, 3,000 confirmed messages; two members
split them (each key at one member, in publish order), a third joins without any offset going
out twice, a member's connection dies and its partitions move with nothing lost, and a second
group reads all 3,000 again."""

from __future__ import annotations

import asyncio

import aio_pika

from eb_support import uniq
from ss_helpers import KEYS, TOTAL, abort_connection, group_state, key_of


async def _publish(url: str, name: str, first: int = 0, end: int = TOTAL) -> None:
    conn = await aio_pika.connect(url)
    ch = await conn.channel(publisher_confirms=True)
    await ch.declare_exchange(name, "x-super-stream", durable=True, arguments={"x-partitions": 3})
    ex = await ch.get_exchange(name)
    for start in range(first, end, 500):   # 500 confirms in flight at a time, in publish order
        await asyncio.gather(*(ex.publish(aio_pika.Message(str(i).encode(), delivery_mode=2),
                                          routing_key=key_of(i))
                               for i in range(start, min(start + 500, end))))
    await conn.close()


class Member:
    def __init__(self, url: str, name: str, group: str, prefetch: int = 20) -> None:
        self.url, self.name, self.group, self.prefetch = url, name, group, prefetch
        self.got: list[tuple[int, int, int]] = []
        self.conn = None

    async def start(self) -> "Member":
        self.conn = await aio_pika.connect(self.url, client_properties={
            "connection_name": f"{self.group}-{id(self)}"})
        ch = await self.conn.channel()
        await ch.set_qos(prefetch_count=self.prefetch)
        queue = await ch.get_queue(self.name, ensure=False)
        await queue.consume(self._on_message, arguments={"x-consumer-group": self.group,
                                                         "x-stream-offset": "first"})
        return self

    async def _on_message(self, msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        h = msg.headers
        self.got.append((int(msg.body), h["x-stream-partition"], h["x-stream-offset"]))
        await msg.ack()


async def _until(predicate, timeout: float = 30.0) -> None:
    async def wait():
        while not predicate():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(wait(), timeout)   # a hang guard, not a performance assertion


def _check(members, expect: int = TOTAL) -> None:
    items = [x for m in members for x in m.got]
    assert len(items) == expect and len({(p, o) for _, p, o in items}) == expect
    assert sorted(i for i, _, _ in items) == list(range(expect))
    for m in members:
        last: dict = {}
        for i, _p, _o in m.got:
            assert last.get(key_of(i), -1) < i
            last[key_of(i)] = i
    parts: dict = {}
    for i, p, _o in items:
        parts.setdefault(key_of(i), set()).add(p)
    assert len(parts) == KEYS and all(len(s) == 1 for s in parts.values())


def test_members_join_and_die_second_group_reads_all(broker):
    name = uniq("ss")

    async def main():
        await _publish(broker.url, name, 0, 1500)
        a = await Member(broker.url, name, "billing").start()
        b = await Member(broker.url, name, "billing").start()
        await _until(lambda: len(a.got) + len(b.got) >= 800)
        assert a.got and b.got
        c = await Member(broker.url, name, "billing").start()
        # the rest is published once c is in (a and b may well have read all of the first part):
        # c's partitions hold a third of it
        await _publish(broker.url, name, 1500, TOTAL)
        await _until(lambda: c.got or len(a.got) + len(b.got) >= TOTAL)
        assert c.got, "the member that joined got a partition"
        # b's connection dies (transport aborted, no connection.close): its partitions move
        await asyncio.get_running_loop().run_in_executor(
            None, abort_connection, broker, f"billing-{id(b)}")
        await _until(lambda: len({i for m in (a, b, c) for i, _, _ in m.got}) >= TOTAL)
        # b's deliveries whose acks never reached the broker went to a or c again (at most its
        # prefetch, each the tail of its key at b); nothing else was delivered twice
        survivors = {i for m in (a, c) for i, _, _ in m.got}
        again = [x for x in b.got if x[0] in survivors]
        assert len(again) <= b.prefetch
        b.got = [x for x in b.got if x[0] not in survivors]
        _check([a, b, c])
        other = await Member(broker.url, name, "audit", prefetch=200).start()
        await _until(lambda: len(other.got) >= TOTAL)
        _check([other])
        for m in (a, c, other):
            await m.conn.close()

    asyncio.run(main())


def test_cancelled_member_keeps_partitions_until_it_acks(broker):
    """basic.cancel leaves a member's deliveries unacked (AMQP): its partitions stay 'draining'
    until it acks them; then the other member continues right after them."""
    name = uniq("ss")

    async def main():
        await _publish(broker.url, name)
        conn = await aio_pika.connect(broker.url)
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=30)
        held: list = []

        async def hold(msg):
            held.append(msg)
        queue = await ch.get_queue(name, ensure=False)
        tag = await queue.consume(hold, arguments={"x-consumer-group": "g", "x-stream-offset": "first"})
        await _until(lambda: len(held) >= 30)
        b = await Member(broker.url, name, "g", prefetch=50).start()
        await _until(lambda: len(group_state(broker, name, "g")["members"]) == 2)
        await queue.cancel(tag)                                   # A leaves, its 30 unacked
        state = await asyncio.get_running_loop().run_in_executor(None, group_state, broker, name, "g")
        assert [p["state"] for p in state["partitions"]] == ["draining"] * 3
        owners = {p["owner"] for p in state["partitions"]}
        assert len(owners) == 1 and None not in owners            # all three given to B, not yet moved
        assert b.got == []
        for msg in held:                                          # A acks after its cancel
            await msg.ack()
        await _until(lambda: len(b.got) >= TOTAL - 30)
        firsts = {}
        for _i, p, o in b.got:
            firsts.setdefault(p, o)
        assert firsts == {p: 10 for p in range(3)}                # right after A's 10 per partition
        a_items = [(int(m.body), m.headers["x-stream-partition"], m.headers["x-stream-offset"]) for m in held]
        items = a_items + b.got
        assert len({(p, o) for _, p, o in items}) == TOTAL == len(items)
        await conn.close()
        await b.conn.close()

    asyncio.run(main())
