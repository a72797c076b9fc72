"""A node that follows the store's definitions (cluster/definitions.py ``apply_rows``) removes
what another node deleted without writing the deletion again: every removal is made with
``store=False``, the broker keeps its own durability. Sans-IO, on a ManualClock."""

from __future__ import annotations

from persistence.store import Definitions
from sansio import SansIOClient

from exchange_broker.assembly import make_broker
from exchange_broker.cluster.definitions import DefinitionRows, apply_rows
from exchange_broker.core import limits
from exchange_broker.core import permissions as perms
from exchange_broker.core.clock import ManualClock
from exchange_broker.core.ports import DefinitionDurability, NullDurability

WRITES = [name for name in vars(DefinitionDurability) if not name.startswith("_")]


class Recorded(NullDurability):
    """Keeps the name of every definition write it is asked for, and the bodies of the messages
    it stored and then removed."""

    def __init__(self) -> None:
        self.writes: list[str] = []
        self.removed: list[bytes] = []
        for name in WRITES:
            setattr(self, name, lambda *args, _name=name, **kwargs: self.writes.append(_name))

    def append(self, q, msg) -> None:
        msg.stored = True

    def remove(self, msg) -> None:
        self.removed.append(bytes(msg.body))


def populated() -> tuple:
    durability = Recorded()
    broker = make_broker(clock=ManualClock(), durability=durability)
    broker.definitions_shared = True  # a cluster's node: transient definitions are written too
    broker.add_vhost("gone")
    vh = broker.vhosts["gone"]
    vh.declare_exchange("fan", "fanout", durable=True, auto_delete=True)
    vh.declare_queue("q", durable=True)
    vh.bind("fan", "queue", "q", "", None, 50, 20)
    broker.add_user("bob", "secret")
    broker.set_permissions("bob", "/", ".*", ".*", ".*")
    perms.set_topic_permission(broker, "bob", "/", "amq.topic", ".*", ".*")
    limits.set_vhost_limit(broker, "gone", "max-queues", 5)
    limits.set_user_limit(broker, "bob", "max-connections", 2)
    durability.writes.clear()
    return broker, durability


def only_guest_on_root() -> DefinitionRows:
    return DefinitionRows(2, Definitions(
        vhosts=[{"name": "/", "metadata": {}, "default_queue_type": None}],
        users=[{"name": "guest", "password_hash": "", "hashing_algorithm": None, "tags": ["administrator"]}],
        permissions=[{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
        exchanges=[], queues=[], bindings=[]))


def test_what_another_node_deleted_goes_here_without_a_write():
    broker, durability = populated()
    counts = apply_rows(broker, only_guest_on_root())
    assert "gone" not in broker.vhosts and "bob" not in broker.users
    assert ("bob", "/") not in broker.permissions and not broker.topic_permissions
    assert not broker.vhost_limits and not broker.user_limits
    assert counts["removed"] == 2  # the vhost and the user: the rest went with them
    assert durability.writes == []
    assert isinstance(broker.durability, Recorded)  # the broker's own durability all along


def test_the_same_deletions_made_here_are_written():
    broker, durability = populated()
    broker.delete_user("bob")
    broker.delete_vhost("gone")
    assert {"user_deleted", "topic_permission_cleared", "user_limit_cleared", "queue_deleted",
            "exchange_deleted", "vhost_limit_cleared", "vhost_deleted"} <= set(durability.writes)


def test_messages_a_followed_policy_drops_from_a_queue_led_here_leave_the_store():
    """The policy was written by another node; the messages its length limit drops here are this
    node's to remove from the store (with the durability swapped out they came back at a restart)."""
    durability, clock = Recorded(), ManualClock()
    broker = make_broker(clock=clock, durability=durability)
    q = broker.vhosts["/"].declare_queue("orders", durable=True)
    q.store_id = 7
    c = SansIOClient(broker, clock)
    for body in (b"1", b"2", b"3"):
        c.publish("orders", body, delivery_mode=2)
    c.take()
    rows = only_guest_on_root()
    rows.defs.queues = [{"id": 7, "vhost": "/", "name": "orders", "durable": True, "exclusive": False,
                         "auto_delete": False, "arguments": None}]
    rows.policies = [{"vhost": "/", "kind": "policy", "name": "short",
                      "value": {"pattern": "^orders$", "definition": {"max-length": 1}, "priority": 0,
                                "apply-to": "queues"}}]
    durability.writes.clear()
    apply_rows(broker, rows)
    assert q.message_count == 1 and q.effective_arguments.get("x-max-length") == 1
    assert durability.removed == [b"1", b"2"]  # dropped from the head, and from the store
    assert durability.writes == []  # the policy is not written again
