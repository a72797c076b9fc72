"""SQLAlchemy declarative models: the single source of truth for the schema.

The schema itself is created only by the alembic migrations in ``migrations/``;
``tests/persistence/test_migrations.py`` checks that the two never drift apart.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-assigns ids for an INTEGER PRIMARY KEY column (a rowid alias).
QueueIdType = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class VHost(Base):
    __tablename__ = "vhosts"
    name: Mapped[str] = mapped_column(String, primary_key=True)
    metadata_json: Mapped[str] = mapped_column(Text, nullable=False)
    # x-queue-type of the queues declared without one (RabbitMQ's default_queue_type; NULL: classic)
    default_queue_type: Mapped[str | None] = mapped_column(String, nullable=True)


class User(Base):
    __tablename__ = "users"
    name: Mapped[str] = mapped_column(String, primary_key=True)
    password_hash: Mapped[str] = mapped_column(Text, nullable=False)
    hashing_algorithm: Mapped[str] = mapped_column(String, nullable=False)
    tags_json: Mapped[str] = mapped_column(Text, nullable=False)


class Permission(Base):
    __tablename__ = "permissions"
    user: Mapped[str] = mapped_column(String, primary_key=True)
    vhost: Mapped[str] = mapped_column(String, primary_key=True)
    configure: Mapped[str] = mapped_column(Text, nullable=False)
    write: Mapped[str] = mapped_column(Text, nullable=False)
    read: Mapped[str] = mapped_column(Text, nullable=False)


class Exchange(Base):
    __tablename__ = "exchanges"
    vhost: Mapped[str] = mapped_column(String, primary_key=True)
    name: Mapped[str] = mapped_column(String, primary_key=True)
    type: Mapped[str] = mapped_column(String, nullable=False)
    durable: Mapped[bool] = mapped_column(Boolean, nullable=False)
    auto_delete: Mapped[bool] = mapped_column(Boolean, nullable=False)
    internal: Mapped[bool] = mapped_column(Boolean, nullable=False)
    arguments: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class Queue(Base):
    __tablename__ = "queues"
    __table_args__ = (
        UniqueConstraint("vhost", "name"),
        {"sqlite_autoincrement": True},  # never reuse a deleted queue's id
    )
    id: Mapped[int] = mapped_column(QueueIdType, primary_key=True, autoincrement=True)
    vhost: Mapped[str] = mapped_column(String, nullable=False)
    name: Mapped[str] = mapped_column(String, nullable=False)
    durable: Mapped[bool] = mapped_column(Boolean, nullable=False)
    exclusive: Mapped[bool] = mapped_column(Boolean, nullable=False)
    auto_delete: Mapped[bool] = mapped_column(Boolean, nullable=False)
    arguments: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    delivered_mark: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")


class Binding(Base):
    __tablename__ = "bindings"
    vhost: Mapped[str] = mapped_column(String, primary_key=True)
    source: Mapped[str] = mapped_column(String, primary_key=True)
    destination: Mapped[str] = mapped_column(String, primary_key=True)
    destination_type: Mapped[str] = mapped_column(String(16), primary_key=True)
    routing_key: Mapped[str] = mapped_column(String, primary_key=True)
    arguments_sha1: Mapped[str] = mapped_column(String(40), primary_key=True)
    arguments: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class Message(Base):
    __tablename__ = "messages"
    queue_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("queues.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    exchange: Mapped[str] = mapped_column(String, nullable=False)
    routing_key: Mapped[str] = mapped_column(String, nullable=False)
    properties: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    body: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    expires_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    priority: Mapped[int] = mapped_column(SmallInteger, nullable=False)


class StreamChunk(Base):
    """A run of consecutive messages of a stream queue (offset = seq - 1), appended in one commit:
    ``data`` is their blob (``stream_chunks.py``); ``count``, ``bytes`` (properties + bodies) and
    the created_ms of its first and last message are kept beside it for seeks and retention."""

    __tablename__ = "stream_chunks"
    __table_args__ = (
        Index("ix_stream_chunks_queue_last_ms", "queue_id", "last_ms", "first_seq"),  # time seeks
    )
    queue_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("queues.id", ondelete="CASCADE"), primary_key=True
    )
    first_seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    last_seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    count: Mapped[int] = mapped_column(Integer, nullable=False)
    bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    first_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    last_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    data: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class StreamOffset(Base):
    __tablename__ = "stream_offsets"
    vhost: Mapped[str] = mapped_column(String, primary_key=True)
    queue: Mapped[str] = mapped_column(String, primary_key=True)
    name: Mapped[str] = mapped_column(String, primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger, nullable=False)


class DelayedMessage(Base):
    """A message held by an x-delayed-message exchange until ``due_ms`` (epoch milliseconds)."""

    __tablename__ = "delayed_messages"
    __table_args__ = (
        Index("ix_delayed_messages_due_ms_id", "due_ms", "id"),  # windows are read in due order
        Index("ix_delayed_messages_vhost_exchange", "vhost", "exchange"),  # exchange deletion
    )
    id: Mapped[int] = mapped_column(QueueIdType, primary_key=True, autoincrement=False)
    vhost: Mapped[str] = mapped_column(String, nullable=False)
    exchange: Mapped[str] = mapped_column(String, nullable=False)
    routing_key: Mapped[str] = mapped_column(String, nullable=False)
    properties: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    body: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    due_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)


class MqttRetained(Base):
    """MQTT's retained message of one topic in one vhost (``properties``: the MQTT 5 property
    block with its length, as MQTT encodes it)."""

    __tablename__ = "mqtt_retained"
    vhost: Mapped[str] = mapped_column(String, primary_key=True)
    topic: Mapped[str] = mapped_column(String, primary_key=True)
    qos: Mapped[int] = mapped_column(SmallInteger, nullable=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    properties: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class Policy(Base):
    """A policy or operator policy (``kind``: ``policy`` / ``operator_policy``); ``value_json`` is
    RabbitMQ's runtime parameter value: pattern, apply-to, priority, definition."""

    __tablename__ = "policies"
    vhost: Mapped[str] = mapped_column(String, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String, primary_key=True)
    value_json: Mapped[str] = mapped_column(Text, nullable=False)


class RuntimeParameter(Base):
    """A runtime parameter (RabbitMQ's component / vhost / name / value): shovels
    (``shovel``), federation upstreams and upstream sets. ``value_json`` is the value as JSON."""

    __tablename__ = "runtime_parameters"
    component: Mapped[str] = mapped_column(String(64), primary_key=True)
    vhost: Mapped[str] = mapped_column(String, primary_key=True)
    name: Mapped[str] = mapped_column(String, primary_key=True)
    value_json: Mapped[str] = mapped_column(Text, nullable=False)


class VHostLimit(Base):
    """A vhost limit (``max-connections``, ``max-queues``); a negative value means no limit."""

    __tablename__ = "vhost_limits"
    vhost: Mapped[str] = mapped_column(String, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, nullable=False)


class UserLimit(Base):
    """A user limit (``max-connections``, ``max-channels``); a negative value means no limit."""

    __tablename__ = "user_limits"
    user: Mapped[str] = mapped_column(String, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, nullable=False)


class TopicPermission(Base):
    """A user's topic permission on one exchange of a vhost: routing-key patterns."""

    __tablename__ = "topic_permissions"
    user: Mapped[str] = mapped_column(String, primary_key=True)
    vhost: Mapped[str] = mapped_column(String, primary_key=True)
    exchange: Mapped[str] = mapped_column(String, primary_key=True)
    write: Mapped[str] = mapped_column(Text, nullable=False)
    read: Mapped[str] = mapped_column(Text, nullable=False)


class ClusterNode(Base):
    """A cluster node: its addresses, when it started and last beat (the database's clock), its
    incarnation (bumped on every start under the same name) and its role (active / standby)."""

    __tablename__ = "cluster_nodes"
    name: Mapped[str] = mapped_column(String, primary_key=True)
    amqp_address: Mapped[str] = mapped_column(String, nullable=False)
    admin_address: Mapped[str] = mapped_column(String, nullable=False)
    pid: Mapped[int] = mapped_column(Integer, nullable=False)
    host: Mapped[str] = mapped_column(String, nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    incarnation: Mapped[int] = mapped_column(BigInteger, nullable=False)
    failover_timeout: Mapped[float] = mapped_column(Float, nullable=False)
    started_at = mapped_column(DateTime(timezone=True), nullable=False)
    heartbeat_at = mapped_column(DateTime(timezone=True), nullable=False)
    # the definitions version this node has loaded (written with its heartbeats; migration 0006)
    definitions_version: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # ``cluster drain``: no queue is placed on or moved to it until ``cluster revive`` (migration 0008)
    draining: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())


class QueueLease(Base):
    """Who leads a queue: ``leader`` until ``expires_at`` (renewed with the leader's heartbeats);
    ``epoch`` grows on every change of leader and fences the writes of a stale one."""

    __tablename__ = "queue_leases"
    vhost: Mapped[str] = mapped_column(String, primary_key=True)
    queue: Mapped[str] = mapped_column(String, primary_key=True)
    leader: Mapped[str] = mapped_column(String, nullable=False)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False)
    expires_at = mapped_column(DateTime(timezone=True), nullable=False)
    moving_to: Mapped[str | None] = mapped_column(String, nullable=True)  # a requested hand-over (0008)


class ClusterCounter(Base):
    """Named counters of the cluster, e.g. ``definitions``: the version of the definitions."""

    __tablename__ = "cluster_counters"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, nullable=False)


vhosts = VHost.__table__
users = User.__table__
permissions = Permission.__table__
exchanges = Exchange.__table__
queues = Queue.__table__
bindings = Binding.__table__
messages = Message.__table__
stream_offsets = StreamOffset.__table__
stream_chunks = StreamChunk.__table__
delayed_messages = DelayedMessage.__table__
policies = Policy.__table__
runtime_parameters = RuntimeParameter.__table__
mqtt_retained = MqttRetained.__table__
vhost_limits = VHostLimit.__table__
user_limits = UserLimit.__table__
topic_permissions = TopicPermission.__table__
cluster_nodes = ClusterNode.__table__
queue_leases = QueueLease.__table__
cluster_counters = ClusterCounter.__table__
