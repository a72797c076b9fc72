"""Queue types behind one interface (``core/queue.QueueType``), registered by their
``x-queue-type`` name: ``classic`` (also what no type means), ``quorum`` and ``stream``."""

from exchange_broker.core.queue import QueueType
from exchange_broker.queue_types.classic import ClassicQueue
from exchange_broker.queue_types.quorum import QuorumQueue
from exchange_broker.queue_types.stream import StreamQueue

QUEUE_TYPES: dict[str, type[QueueType]] = {
    "classic": ClassicQueue,
    "quorum": QuorumQueue,
    "stream": StreamQueue,
}

__all__ = ["QUEUE_TYPES", "ClassicQueue", "QuorumQueue", "StreamQueue"]
