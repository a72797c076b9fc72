"""Protocol errors carrying the AMQP reply code RabbitMQ would send."""

from __future__ import annotations

from exchange_broker.protocol.constants import HARD_ERRORS, REPLY_NAMES


class AMQPError(Exception):
    """An error that closes a channel (soft) or the connection (hard).

    ``text`` is the human part; the reply text sent on the wire is
    ``"<NAME> - <text>"`` as RabbitMQ writes it.
    """

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0,
                 *, hard: bool | None = None) -> None:
        super().__init__(f"{code} {REPLY_NAMES.get(code, '')} - {text}")
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id
        self.hard = code in HARD_ERRORS if hard is None else hard

    @property
    def reply_text(self) -> str:
        reply = f"{REPLY_NAMES.get(self.code, 'ERROR')} - {self.text}"
        raw = reply.encode("utf-8")
        if len(raw) <= 255:
            return reply
        return raw[:255].decode("utf-8", "ignore")  # a short string: at most 255 bytes of UTF-8

    def for_method(self, class_id: int, method_id: int) -> "AMQPError":
        if not self.class_id:
            self.class_id, self.method_id = class_id, method_id
        return self


def channel_error(code: int, text: str) -> AMQPError:
    return AMQPError(code, text, hard=False)


def connection_error(code: int, text: str) -> AMQPError:
    return AMQPError(code, text, hard=True)
