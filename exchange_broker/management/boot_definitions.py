"""Definitions imported at boot (``serve --load-definitions FILE``, RabbitMQ's ``load_definitions``).

The file is the JSON the admin API exports (``GET /api/definitions``) and imports, merged by the
same code (:func:`~exchange_broker.management.definitions.import_definitions`): users, vhosts,
permissions, policies, limits, exchanges, queues, bindings. A directory imports each ``*.json`` in
it in name order, as RabbitMQ does. The broker imports them before its listeners accept clients;
a file it cannot read or apply stops the start-up with one line naming the file.
"""
from __future__ import annotations

import json
import logging
import os

from exchange_broker.management.common import AdminContext, ServiceError
from exchange_broker.management.definitions import import_definitions
from exchange_broker.protocol.errors import AMQPError

log = logging.getLogger(__name__)


def definition_files(path: str) -> list[str]:
    """``path`` itself, or the ``*.json`` files of the directory ``path`` in name order."""
    if os.path.isdir(path):
        return [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".json")]
    return [path]


def load_definitions(broker, path: str) -> None:
    """Import the definitions at ``path`` into ``broker``; ValueError (one line) when it cannot."""
    ctx = AdminContext(broker)
    for name in definition_files(path):
        try:
            with open(name, "rb") as fh:
                doc = json.loads(fh.read())
        except OSError as exc:
            raise ValueError(f"--load-definitions {name}: {exc.strerror or exc}") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"--load-definitions {name}: not valid JSON: {exc}") from None
        try:
            counts = import_definitions(ctx, doc)
        except ServiceError as exc:
            reason = exc.reason if isinstance(exc.reason, str) else json.dumps(exc.reason)
            raise ValueError(f"--load-definitions {name}: {' '.join(reason.split())}") from None
        except AMQPError as exc:
            raise ValueError(f"--load-definitions {name}: {exc.text}") from None
        log.info("definitions imported from %s: %s", name,
                 ", ".join(f"{n} {kind}" for kind, n in counts.items() if n))
