"""A queue another node leads: :class:`RemoteQueue`, the placeholder a node holds for it
(docs/cluster-design.md, steps 2 to 4).

To the channel it is a queue like any other; its messages live on the leader, reached through
this node's links (``links.py``):

* ``enqueue`` forwards the message (raw properties and body, default exchange, routing key = the
  queue's name, mandatory) on the link's confirm channel and returns the Waiter the leader's
  confirm fires: the publisher's confirm is an ack only once the leader acked; the leader's
  nack, a return or a lost link make it a nack. (The broker combines this waiter with local
  queues' store waiters: ``Waiter.all``.)
* ``add_consumer`` starts a :class:`~exchange_broker.cluster.relay.Relay`: a consumer on the
  leader (the local consumer's prefetch as basic.qos, exclusive and the consume arguments passed
  through) whose deliveries reach the local consumer; acks, nacks, rejects and requeues go back
  by the leader's delivery tags. The leader's basic.cancel (queue deleted there) or a lost link
  cancel the local consumer as a deleted queue does (consumer-cancel-notify).
* ``get`` is basic.get over the link. The channel's answer cannot wait for the network inside
  ``get``, so it uses the hook paged queues use: ``get`` answers None, ``get_pending`` says
  "wait", the channel parks the get in ``waiting_gets`` and calls ``maybe_refill``, which sends a
  basic.get per parked get; each answer retries the parked gets (``answer_waiting_gets``).
* ``message_count`` is approximate: the ready count the leader gave with its last get-ok (0
  after a get-empty, 0 before any get). Placeholders do not poll the leader.
* queue.purge and queue.delete (AMQP and the admin API) are the queue type's ``purge_later`` and
  ``delete_later``: the leader purges or deletes it, the reply waits for its answer (the
  synchronous ``purge`` is refused, 406).
* a message forwarded here by another node is nacked, never forwarded again (see ``enqueue``).

Limits: ``consume-ok`` goes to the client before the leader answered the relay's basic.consume;
a refusal there (exclusive use, no such queue) cancels the local consumer (basic.cancel).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Iterable

from pamqp import commands

from exchange_broker.client import ClientError
from exchange_broker.cluster.links import FLOW_HIGH, Address, Links, spawn
from exchange_broker.cluster.relay import ACK, NACK, REJECT, Getter, Relay, TagMap
from exchange_broker.core.actions import Block
from exchange_broker.core.message import Message
from exchange_broker.core.ports import Waiter
from exchange_broker.core.names import describe
from exchange_broker.core.queue import QueueType
from exchange_broker.core.queue_args import QueueOptions
from exchange_broker.protocol.constants import INTERNAL_ERROR, NOT_FOUND, PRECONDITION_FAILED, RESOURCE_LOCKED
from exchange_broker.protocol.errors import AMQPError

log = logging.getLogger("exchange_broker.cluster")


def address_of(leader) -> Address | None:
    """The AMQP address of a ``persistence.cluster_leaders.Leader`` (None: not a live node)."""
    if leader is None or not leader.amqp_address:
        return None
    host, _, port = leader.amqp_address.rpartition(":")
    return Address(host.strip("[]"), int(port))


def forwarded_by_node(broker, publisher) -> bool:
    """The publisher is another node's link (what it forwards is never forwarded again). A
    connection knows it from its login, once (``Session.from_link``); any other publisher is
    asked by its user name."""
    if publisher is None:
        return False
    known = getattr(publisher, "from_link", None)
    if known is not None:
        return known
    return broker.is_link_user(getattr(publisher, "user", None) or "")


class RemoteQueue(QueueType):
    CAPABILITIES: frozenset[str] = frozenset()  # not held here: its messages are the leader's

    def __init__(self, broker, vhost: str, name: str, *, links: Links, address: Address | None,
                 leader: str = "", durable: bool = True, auto_delete: bool = False,
                 arguments: dict | None = None, options: QueueOptions | None = None) -> None:
        super().__init__(broker, vhost, name, durable, None, auto_delete, arguments, options)
        self.queue_type = self.arguments.get("x-queue-type") or "classic"  # the leader's type
        self.links = links
        self.address = Address(*address) if address is not None else None  # None: no live leader
        self.leader = leader or (f"{self.address.host}:{self.address.port}" if self.address else "?")
        self.tags = TagMap()               # relayed messages not yet settled
        self.relays: dict = {}             # local consumer -> Relay
        self.getter = Getter(self)
        self.fetched: deque[Message] = deque()  # basic.get answers not yet handed out
        self.empty_answers = 0
        self.get_errors: deque[str] = deque()
        self.gets_in_flight = 0
        self.last_count = 0
        self._answered_empty = False

    @classmethod
    def declare(cls, broker, vhost, name, durable, owner, auto_delete, arguments):
        raise AMQPError(PRECONDITION_FAILED, f"{vhost.describe('queue', name)} is led by another "
                        f"node", 50, 10, hard=False)

    def describe(self) -> str:
        return describe("queue", self.name, self.vhost)

    # -- state --------------------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """Approximate: the leader's count at the last basic.get (see the module doc)."""
        return self.last_count

    @property
    def wants_dispatch(self) -> bool:
        return not self.deleted and any(r.buffer for r in self.relays.values())

    # -- publishing ---------------------------------------------------------------------------------
    def enqueue(self, msg: Message, publisher, per_message_ttl: int | None):
        """Forward to the leader; the waiter fires with its confirm. The TTL travels in the
        properties (``expiration``), the queue's own TTL applies on the leader."""
        msg.queue = self
        self.stats_published += 1
        if self.address is None or forwarded_by_node(self.broker, publisher):
            # no live leader yet (a failover or a move is under way), or forwarded here by a node
            # that thinks this one leads it (it moved meanwhile): a nack, never a second hop (two
            # placeholders forwarding to each other while a move is under way would each wait for
            # the other's confirm)
            w = Waiter()
            w.fire(False)
            return w
        fw = self._forwarder
        if fw is None or fw.address != self.address:
            fw = self._forwarder = self.links.forwarder(self.address, self.vhost)
        waiter = fw.publish(self.name, msg.properties, msg.body)
        if publisher is not None and fw.in_flight > FLOW_HIGH and publisher not in self.flow_blocked:
            waiter = Block(self, waiter)  # the channel stops reading it until the leader confirmed the backlog
            if self.release_publishers not in fw.on_drained:
                fw.on_drained.append(self.release_publishers)
        return waiter

    # -- consuming ----------------------------------------------------------------------------------
    def add_consumer(self, consumer) -> None:
        self.had_consumer = True
        self.consumers.append(consumer)
        if self.address is not None:  # else it waits for a leader (``retarget``)
            self._relay(consumer)

    def _relay(self, consumer) -> None:
        relay = self.relays[consumer] = Relay(self, consumer)
        relay.start()

    def retarget(self, leader) -> bool:
        """The queue's leader is ``leader`` now (a ``Leader``: node name, AMQP address; None or no
        address: none is alive yet). Consumers relayed from the old leader are cancelled
        (basic.cancel: they consume again through this node and get the new leader's messages,
        unacked ones redelivered); consumers that waited for a leader start now. True if it moved."""
        address = address_of(leader)
        name = leader.node if leader is not None else ""
        if address == self.address and (not name or name == self.leader):
            return False
        self.address, self.leader = address, name or self.leader
        for relay in list(self.relays.values()):
            relay.gone()
        spawn(self.getter.close())
        self._return_leftovers()
        if address is not None:
            for consumer in list(self.consumers):
                if consumer not in self.relays:
                    self._relay(consumer)
        return True

    def remove_consumer(self, consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            pass
        relay = self.relays.pop(consumer, None)
        if relay is not None:
            relay.stop()
        # (an auto-delete queue is deleted by its leader once its last consumer, relays included,
        # is gone: not by a node whose own consumers went)

    def relay_gone(self, relay: Relay) -> None:
        """A relay lost its consumer on the leader: cancel the local consumer (basic.cancel)."""
        c = relay.consumer
        if self.relays.get(c) is relay:
            del self.relays[c]
        if relay.stopping:
            return
        try:
            self.consumers.remove(c)
        except ValueError:
            return
        c.queue_deleted()

    def dispatch(self) -> None:
        for relay in list(self.relays.values()):
            if relay.buffer:
                relay.pump()

    # -- settling (by the leader's delivery tags) ---------------------------------------------------
    def settle(self, msg: Message) -> None:
        self.tags.settle(msg, ACK)

    def delivered(self, msg: Message) -> None:
        pass  # the leader marks it

    def reject(self, msg: Message) -> None:
        self.tags.settle(msg, REJECT, False)  # the leader dead-letters (or drops) it

    def requeue(self, msgs: Iterable[Message]) -> None:
        for msg in msgs:
            self.tags.settle(msg, NACK, True)

    _leader_error = None
    _forwarder = None  # the links' Forwarder to the leader (looked up again when it moved)

    def purge(self) -> list[Message]:
        """A synchronous purge: refused (queue.purge and the admin API use ``purge_later``)."""
        raise AMQPError(PRECONDITION_FAILED, f"{self.describe()} is led by node '{self.leader}': "
                        f"purge it there", 50, 30, hard=False)

    async def _on_leader(self, m, reply):
        """One synchronous method on the leader, on a link channel of its own; its answer."""
        if self.address is None:
            raise ClientError("no node leads it now (a failover is under way)")
        link = await self.links.link(self.address, self.vhost)
        ch = await link.channel()
        try:
            return await ch.call(m, reply)
        finally:
            await ch.close()

    def _leader_call(self, what: str, m, reply, method_id: int, answered) -> Waiter:
        """``m`` on the leader; the waiter fires True after ``answered(answer)`` ran, False (with
        ``command_error()`` says why) when the leader refused or could not be reached."""
        done = Waiter()

        async def run() -> None:
            try:
                answer = await self._on_leader(m, reply)
            except (ClientError, OSError) as exc:
                self._failed_on_leader(what, exc, method_id)
                done.fire(False)
                return
            answered(answer)
            done.fire(True)
        spawn(run())
        return done

    def purge_later(self, purge_ok) -> Waiter:
        """queue.purge on the leader: ``purge_ok`` gets the leader's message count."""
        def answered(answer) -> None:
            purge_ok.message_count = answer.message_count
        return self._leader_call("purging", commands.Queue.Purge(queue=self.name), commands.Queue.PurgeOk, 30,
                                 answered)

    def delete_later(self, delete_ok, if_unused: bool, if_empty: bool) -> Waiter:
        """queue.delete on the leader (its if-unused and if-empty checks); once it answered, the
        placeholder goes at once (the leader's definition change removes it on every node)."""
        def answered(answer) -> None:
            delete_ok.message_count = answer.message_count
            self._drop_here()
        return self._leader_call("deleting", commands.Queue.Delete(queue=self.name, if_unused=if_unused,
                                                                   if_empty=if_empty),
                                 commands.Queue.DeleteOk, 40, answered)

    async def served_by_leader(self) -> bool:
        """The leader answers a passive queue.declare for it (it serves the queue)."""
        try:
            await self._on_leader(commands.Queue.Declare(queue=self.name, passive=True), commands.Queue.DeclareOk)
            return True
        except (ClientError, OSError):
            return False

    def _drop_here(self) -> None:
        """Deleted on the leader: gone from this node now, without a write (the leader wrote it)."""
        vh = self.broker.vhosts.get(self.vhost)
        if vh is not None and vh.queues.get(self.name) is self:
            vh.remove_queue(self, store=False)

    def _failed_on_leader(self, what: str, exc: Exception, method_id: int) -> None:
        code = getattr(exc, "code", 0)
        if code in (PRECONDITION_FAILED, NOT_FOUND, RESOURCE_LOCKED):  # the leader's own answer
            text = str(exc).split(": ", 1)[-1]
            self._leader_error = AMQPError(code, text.split(" - ", 1)[-1], 50, method_id, hard=False)
        else:
            log.warning("%s %s on node '%s' failed: %s", what, self.describe(), self.leader, exc)
            self._leader_error = AMQPError(INTERNAL_ERROR, f"{what} {self.describe()} on its leader node "
                                           f"'{self.leader}' failed: {exc}", 50, method_id, hard=True)

    def command_error(self) -> AMQPError:
        return self._leader_error or AMQPError(INTERNAL_ERROR, f"{self.describe()}: its leader node failed",
                                               50, 0, hard=True)

    # -- basic.get ----------------------------------------------------------------------------------
    def get(self) -> Message | None:
        self._answered_empty = False
        if self.fetched:
            return self.fetched.popleft()
        if self.get_errors:
            raise AMQPError(NOT_FOUND, f"{self.describe()}: its leader node '{self.leader}' is "
                            f"unreachable ({self.get_errors.popleft()})", 60, 70, hard=False)
        if self.empty_answers:
            self.empty_answers -= 1
            self._answered_empty = True
        return None

    @property
    def get_pending(self) -> bool:
        """After ``get`` answered None: wait for the leader unless it just said empty."""
        return not self._answered_empty and not self.deleted

    def maybe_refill(self) -> None:
        """One basic.get on the leader for each parked get not already covered."""
        need = len(self.waiting_gets) - self.gets_in_flight - len(self.fetched)
        if need <= 0:
            return
        for _ in range(need):
            self.gets_in_flight += 1
            spawn(self._fetch())

    async def _fetch(self) -> None:
        msg = None
        try:
            if self.address is None:
                raise ClientError("no node leads it now (a failover is under way)")
            msg = await self.getter.fetch()
        except (ClientError, OSError) as exc:
            self.get_errors.append(str(exc))
        finally:
            self.gets_in_flight -= 1
        if msg is not None:
            self.fetched.append(msg)
        elif not self.get_errors:
            self.empty_answers += 1
        self.answer_waiting_gets()
        if not self.waiting_gets and not self.gets_in_flight:
            self._return_leftovers()

    def _return_leftovers(self) -> None:
        """Answers nobody waits for any more (their channels closed): back to the leader."""
        leftovers, self.fetched = self.fetched, deque()
        for msg in leftovers:
            self.tags.settle(msg, NACK, True)
        self.empty_answers = 0
        self.get_errors.clear()

    # -- lifecycle ------------------------------------------------------------------------------------
    def on_deleted(self) -> None:
        """The placeholder is dropped: stop relaying (the leader requeues what was unacked)."""
        for relay in list(self.relays.values()):
            relay.gone()
        self.relays.clear()
        self._return_leftovers()
        spawn(self.getter.close())
