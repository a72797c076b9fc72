"""The one error of the asyncio AMQP client."""

from __future__ import annotations


class ClientError(Exception):
    """A connection or one of its channels is closed (``code`` is the AMQP reply code, 0 if none)."""

    def __init__(self, text: str, code: int = 0) -> None:
        super().__init__(text)
        self.code = code
