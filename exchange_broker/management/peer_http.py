"""One request to another node's admin API, as the cluster's nodes ask each other for what only
that node knows (a queue's figures on its leader, the movers a node runs)."""

from __future__ import annotations

import http.client
import json


def peer_request(method: str, address: str, path: str, auth: str | None, marker: str,
                 timeout: float) -> tuple[int, object]:
    """``(status, parsed JSON or None)`` from the admin API at ``address`` (host:port). ``marker``
    is a header that asks the node to answer from its own state only (no asking on)."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
    try:
        headers = {marker: "1", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = auth
        conn.request(method, path, headers=headers)
        reply = conn.getresponse()
        data = reply.read()
        try:
            return reply.status, (json.loads(data) if data else None)
        except ValueError:
            if reply.status < 300:
                raise
            return reply.status, None  # an error page that is not JSON
    finally:
        conn.close()
