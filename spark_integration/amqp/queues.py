"""Queue methods on the client's channel (a mixin of ``Connection``, which supplies ``_rpc``)."""

from __future__ import annotations

from pamqp import commands

__all__ = ["QueueMethods"]


class QueueMethods:
    def queue_declare(self, queue: str, passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False,
                      arguments: dict | None = None) -> tuple[str, int, int]:
        """Returns (name, message_count, consumer_count)."""
        ok = self._rpc(commands.Queue.Declare(queue=queue, passive=passive, durable=durable,
                                              exclusive=exclusive, auto_delete=auto_delete,
                                              arguments=arguments or {}),
                       commands.Queue.DeclareOk)
        return ok.queue, ok.message_count, ok.consumer_count

    def queue_bind(self, queue: str, exchange: str, routing_key: str = "",
                   arguments: dict | None = None) -> None:
        self._rpc(commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=routing_key,
                                      arguments=arguments or {}), commands.Queue.BindOk)

    def queue_delete(self, queue: str) -> int:
        return self._rpc(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk).message_count

    def queue_purge(self, queue: str) -> int:
        return self._rpc(commands.Queue.Purge(queue=queue), commands.Queue.PurgeOk).message_count
