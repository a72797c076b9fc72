"""The exchange-type interface: what every type module (direct, fanout, topic, headers,
x-delayed-message) provides, and the errors a declaration can meet. Pure: no IO, no pamqp.

The broker core turns the errors into AMQP replies: :class:`UnknownExchangeType` is 503
COMMAND_INVALID ("unknown exchange type 'x'"), :class:`InvalidExchangeArguments` is 406
PRECONDITION_FAILED with the error's text, as RabbitMQ answers.
"""
from __future__ import annotations

from .base import BindingTable


class UnknownExchangeType(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown exchange type '{name}'")
        self.name = name


class InvalidExchangeArguments(ValueError):
    """The declaration's arguments are refused by the type (the text is RabbitMQ's)."""


class ExchangeType:
    """One exchange type: its name and how it builds a binding index.

    ``holds_messages``: a publish may be held back before it is routed (x-delayed-message); the
    core then hands the message to its delayed-message manager instead of routing it at once.
    """

    name: str = ""
    holds_messages = False
    index_class: type[BindingTable] | None = None

    def make_index(self, arguments: dict | None, registry: dict[str, "ExchangeType"]) -> BindingTable:
        """A fresh binding index for an exchange of this type declared with ``arguments``."""
        return self.index_class()
