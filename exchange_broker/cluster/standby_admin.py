"""A standby node's admin API: every request is forwarded to the active node's admin API.

The web UI, ``/api/...`` and ``/metrics`` answer on every node of a cluster, with the figures of
the one node that serves. Each request is sent on to ``cluster_nodes.admin_address`` of the active
node (``http.client`` on an executor thread: admin requests are few and small) with an
``X-Forwarded-For`` header naming the real client; the active node believes that header only from
a peer on its own host (uvicorn's ``forwarded_allow_ips``), so guest's loopback-only rule holds.
No active node, or it cannot be reached: ``503`` with a JSON reason.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
from typing import Callable

from exchange_broker.cluster.forward import split_address

TIMEOUT = 30.0
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
              b"transfer-encoding", b"upgrade", b"host", b"content-length"}


class StandbyAdminApp:
    """ASGI: forward to ``target()`` ('host:port' of the active node's admin API, or None)."""

    def __init__(self, target: Callable[[], "str | None"], https: bool = False) -> None:
        self.target = target
        self.https = https

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        target = self.target()
        if target is None:
            await _answer(send, 503, {"error": "unavailable",
                                      "reason": "this node is a cluster standby and no active node is known yet"})
            return
        path = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            path += b"?" + scope["query_string"]
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        client = scope.get("client")
        forwarded = [v for k, v in headers if k.lower() == b"x-forwarded-for"]
        headers = [(k, v) for k, v in headers if k.lower() != b"x-forwarded-for"]
        if client:
            chain = (forwarded[0] + b", " if forwarded else b"") + client[0].encode()
            headers.append((b"x-forwarded-for", chain))
        try:
            status, reply_headers, data = await asyncio.get_running_loop().run_in_executor(
                None, self._forward, target, scope["method"], path.decode("latin-1"), headers, bytes(body))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            await _answer(send, 503, {"error": "unavailable",
                                      "reason": f"the active node's admin API at {target} cannot be reached: "
                                                f"{' '.join(str(exc).split()) or exc.__class__.__name__}"})
            return
        await send({"type": "http.response.start", "status": status, "headers": reply_headers})
        await send({"type": "http.response.body", "body": data})

    def _forward(self, target: str, method: str, path: str, headers, body: bytes):
        host, port = split_address(target)
        if self.https:
            context = ssl.create_default_context()
            context.check_hostname = False  # the node's own certificate; the address came from the store
            context.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection(host, port, timeout=TIMEOUT, context=context)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", target)
            for key, value in headers:
                conn.putheader(key.decode("latin-1"), value.decode("latin-1"))
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            reply = conn.getresponse()
            data = reply.read()
            out = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.getheaders()
                   if k.lower().encode("latin-1") not in HOP_BY_HOP]
            out.append((b"content-length", str(len(data)).encode()))
            return reply.status, out, data
        finally:
            conn.close()


async def _answer(send, status: int, payload: dict) -> None:
    data = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
