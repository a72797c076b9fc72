"""The exchange-type interface: what every type module (direct, fanout, topic, headers,
x-delayed-message, x-super-stream) provides — its binding index, how a declaration is checked,
what the type does when an exchange of it is created or deleted — and the errors a declaration
can meet. Pure: no IO, no pamqp; the virtual host is seen through :class:`Definitions`.

The broker core turns the errors into AMQP replies: :class:`UnknownExchangeType` is 503
COMMAND_INVALID ("unknown exchange type 'x'"), :class:`InvalidExchangeArguments` is 406
PRECONDITION_FAILED with the error's text, as RabbitMQ answers.
"""
from __future__ import annotations

from typing import Any, Protocol

from .base import BindingTable


class UnknownExchangeType(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown exchange type '{name}'")
        self.name = name


class InvalidExchangeArguments(ValueError):
    """The declaration's arguments are refused by the type (the text is RabbitMQ's)."""


class Definitions(Protocol):
    """What an exchange type may use of the virtual host it is declared in (the core's VHost):
    errors the core raises there (AMQP replies) pass through the type untouched."""

    name: str
    queues: dict[str, Any]

    def describe(self, kind: str, name: str) -> str: ...

    def check_queue(self, name: str, arguments: dict) -> None:
        """Raise what declaring a durable queue with ``arguments`` would raise; create nothing."""

    def declare_queue(self, name: str, *, durable: bool, arguments: dict) -> Any: ...

    def bind(self, source: str, dest_type: str, dest: str, routing_key: str, arguments: dict,
             class_id: int, method_id: int) -> None: ...

    def remove_queue(self, q: Any) -> int: ...


class ExchangeType:
    """One exchange type: its name, how it builds a binding index, and what a declaration of it
    checks and does besides (all no-ops here: the plain types need nothing more).

    ``holds_messages``: a publish may be held back before it is routed (x-delayed-message); the
    core then hands the message to its delayed-message manager instead of routing it at once.
    ``in_leaders_cluster``: may be declared in a cluster where each queue has its own leader.
    """

    name: str = ""
    holds_messages = False
    in_leaders_cluster = True
    index_class: type[BindingTable] | None = None

    def make_index(self, arguments: dict | None, registry: dict[str, "ExchangeType"]) -> BindingTable:
        """A fresh binding index for an exchange of this type declared with ``arguments``."""
        return self.index_class()

    def check_declare(self, defs: Definitions, name: str, durable: bool, auto_delete: bool,
                      arguments: dict, existing: Any) -> None:
        """Before an exchange.declare of this type changes anything (``existing``: the exchange
        of that name, if any): InvalidExchangeArguments for what cannot be."""

    def created(self, defs: Definitions, exchange: Any) -> None:
        """A new exchange of this type was added: make what it owns."""

    def deleting(self, defs: Definitions, exchange: Any) -> None:
        """An exchange of this type is being deleted: remove what it owns."""
