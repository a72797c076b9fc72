"""The channel's transaction methods (tx.select, tx.commit, tx.rollback), a part of :class:`Channel`.

In a transactional channel publishes and acknowledgements are buffered; tx.commit applies them and
answers commit-ok only once every persistent message of the transaction is stored.
"""

from __future__ import annotations

from pamqp import commands

from exchange_broker.protocol.constants import PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError


class TransactionMethods:
    """Mixed into Channel: uses its ``session``, ``confirm``, ``closed``, ``unacked``, ``_route`` and
    ``_settle``."""

    tx = False

    def _tx_init(self) -> None:
        self.tx_publishes: list = []
        self.tx_acks: list = []

    def _tx_select(self, m) -> None:
        if self.confirm:
            raise AMQPError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode", 90, 10,
                            hard=False)
        self.tx = True
        self.reply(commands.Tx.SelectOk())

    def _tx_commit(self, m) -> None:
        if not self.tx:
            raise AMQPError(PRECONDITION_FAILED, "channel is not transactional", 90, 20, hard=False)
        pending = [w for w in self.tx_apply() if not w.done]
        if not pending:
            self.reply(commands.Tx.CommitOk())
            return
        # commit-ok only once every persistent message of the transaction is stored
        self.reply_when_stored(pending, commands.Tx.CommitOk(), 90, 20,
                               "could not store the transaction's messages")

    def _tx_rollback(self, m) -> None:
        if not self.tx:
            raise AMQPError(PRECONDITION_FAILED, "channel is not transactional", 90, 30, hard=False)
        self.tx_publishes.clear()
        self.tx_restore()
        self.reply(commands.Tx.RollbackOk())

    def tx_restore(self) -> None:
        """The deliveries acknowledged in the open transaction are outstanding again, in tag order
        (RabbitMQ's tx.rollback puts them back into the unacked queue)."""
        if not self.tx_acks:
            return
        unacked = self.unacked
        items = sorted([*unacked.items(), *(item for _, taken, _ in self.tx_acks for item in taken)])
        self.tx_acks.clear()
        unacked.clear()
        unacked.update(items)

    def tx_apply(self) -> list:
        """Apply buffered publishes and acks; returns durability waiters to wait for."""
        waiters: list = []
        publishes, acks = self.tx_publishes, self.tx_acks
        self.tx_publishes, self.tx_acks = [], []
        exchanges = self.session.vhost.exchanges
        for ex, rk, mandatory, props, body in publishes:
            if ex.name not in exchanges:
                continue
            self._route(ex, rk, mandatory, props, body, 0, waiters)
        for kind, taken, requeue in acks:  # taken out of unacked when they came (ack)
            self._settle([entry for _, entry in taken], kind, requeue)
        return waiters
