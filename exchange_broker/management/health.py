"""Health checks: /api/health/checks/* with RabbitMQ's answers (200 ``{"status": "ok", ...}``,
503 ``{"status": "failed", "reason": ...}`` and the details RabbitMQ gives), for any management
user. Bodies compared by hand with RabbitMQ 3.10's management API.

The listeners this node has: ``amqp`` (the AMQP port), ``amqp/ssl`` (the AMQPS port, with its
certificate files) and ``http`` or ``https`` (the admin API the request came in on; with HTTPS it
serves the AMQPS certificate, see ``app.start_admin``). A single node: ``node-is-quorum-critical``
and ``node-is-mirror-sync-critical`` are always ok, as RabbitMQ answers for a single-node cluster.
"""

from __future__ import annotations

import base64
import calendar
import re
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from exchange_broker.management.common import NODE, AdminContext, Principal, bad_request
from exchange_broker.management.web import Ctx, Who, u

router = APIRouter(tags=["health"])

ALARM_NAMES = {"memory": "memory", "disk": "disk space"}  # broker.alarms key -> RabbitMQ's resource
UNIT_SECONDS = {"days": 86400, "weeks": 86400 * 7, "months": 86400 * 365 / 12, "years": 86400 * 365}
_INTEGER = re.compile(r"[+-]?[0-9]+")

# RabbitMQ's protocol aliases (rabbit_mgmt_wm_health_check_protocol_listener), for the protocols
# a node can have; any other name is looked up as it is.
_ALIASES = {"amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp", "amqp0_9_1": "amqp",
            "amqp10": "amqp", "amqp1.0": "amqp", "amqp1-0": "amqp", "amqp1_0": "amqp",
            "amqps": "amqp/ssl", "http1": "http", "http1.1": "http", "http_api": "http",
            "management": "http", "management_ui": "http", "ui": "http", "cli": "clustering",
            "distribution": "clustering", "mqtts": "mqtt/ssl", "web-mqtt": "http/web-mqtt", "mqtt+tls": "mqtt/ssl",
            "mqtt+ssl": "mqtt/ssl", "stomps": "stomp/ssl", "stomp+tls": "stomp/ssl",
            "stomp+ssl": "stomp/ssl"}


def ok(**extra) -> dict:
    return {"status": "ok", **extra}


def failed(reason: str, **details) -> JSONResponse:
    return JSONResponse({"status": "failed", "reason": reason, **details}, status_code=503)


# ---- listeners -----------------------------------------------------------------------------------
def listeners(ctx: AdminContext, request: Request | None = None) -> list[dict]:
    """This node's listeners: protocol, interface, port and (TLS) certificate files."""
    out = []
    amqp = ctx.amqp_server
    if amqp is not None:
        host = amqp.host or "0.0.0.0"
        out.append({"protocol": "amqp", "interface": host, "port": amqp.port})
        tls = amqp.tls
        if tls is not None and amqp.tls_port:
            out.append({"protocol": "amqp/ssl", "interface": host, "port": amqp.tls_port,
                        "certfile": tls.certfile, "cacertfile": tls.cafile})
        out += [dict(other) for other in getattr(amqp, "other_listeners", ())]  # MQTT
    if request is not None:
        server = request.scope.get("server") or ("", 0)
        https = request.url.scheme == "https"
        item = {"protocol": "https" if https else "http", "interface": server[0], "port": server[1]}
        if https and amqp is not None and amqp.tls is not None:
            item.update(certfile=amqp.tls.certfile, cacertfile=amqp.tls.cafile)
        out.append(item)
    return out


def normalize_protocol(name: str) -> str:
    lowered = name.lower()
    return _ALIASES.get(lowered, lowered)


# ---- certificates --------------------------------------------------------------------------------
_PEM = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.S)


def _der(buf: bytes, pos: int) -> tuple[int, int, int]:
    """One DER element at ``pos``: (tag, start of its content, end of its content)."""
    tag = buf[pos]
    length = buf[pos + 1]
    pos += 2
    if length & 0x80:
        n = length & 0x7F
        if not 1 <= n <= 4:
            raise ValueError("unsupported DER length")
        length = int.from_bytes(buf[pos:pos + n], "big")
        pos += n
    if pos + length > len(buf):
        raise ValueError("truncated DER")
    return tag, pos, pos + length


def _der_time(tag: int, raw: bytes) -> int:
    text = raw.decode("ascii")
    if tag == 0x17:  # UTCTime YYMMDDHHMMSSZ
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != 0x18:  # GeneralizedTime YYYYMMDDHHMMSSZ
        raise ValueError("not a time")
    y, mo, d, h, mi, s = (int(text[i:j]) for i, j in ((0, 4), (4, 6), (6, 8), (8, 10), (10, 12), (12, 14)))
    return calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))


def validity(der: bytes) -> tuple[int, int]:
    """(notBefore, notAfter) of an X.509 certificate, as POSIX seconds."""
    _t, start, _end = _der(der, 0)                 # Certificate
    _t, pos, end = _der(der, start)                # tbsCertificate
    tag, _s, after = _der(der, pos)
    if tag == 0xA0:                                # [0] version
        pos = after
    for _field in range(3):                        # serialNumber, signature, issuer
        _t, _s, pos = _der(der, pos)
    _t, pos, _e = _der(der, pos)                   # validity
    tag, s, e = _der(der, pos)
    not_before = _der_time(tag, der[s:e])
    tag, s2, e2 = _der(der, e)
    return not_before, _der_time(tag, der[s2:e2])


def expiring_within(path: str | None, deadline: float, now: float) -> list[str] | dict:
    """The expiry dates (RabbitMQ's format) of the certificates in a PEM file that end before
    ``deadline``, or ``{"error": ...}`` when the file cannot be read or holds no certificate."""
    if not path:
        return []
    try:
        with open(path, "rb") as fh:
            blocks = [b for kind, b in _PEM.findall(fh.read()) if kind == b"CERTIFICATE"]
    except OSError as exc:
        return {"error": f"cannot read {path}: {exc.strerror or exc}"}
    if not blocks:
        return {"error": "The certificate file provided does not contain any PEM entry."}
    out = []
    for block in blocks:
        try:
            not_before, not_after = validity(base64.b64decode(b"".join(block.split())))
        except (ValueError, IndexError, UnicodeDecodeError):
            out.append("error: the certificate cannot be decoded")
            continue
        if not_before > now:
            out.append("error: Certificate is not yet valid")
        elif not_after < deadline:
            t = time.gmtime(not_after)
            out.append(f"{t.tm_year}-{t.tm_mon:02d}-{t.tm_mday:02d} {t.tm_hour}:{t.tm_min:02d}:{t.tm_sec:02d}")
    return out


def certificate_expiration(ctx: AdminContext, within: str, unit: str, request: Request | None = None):
    if not _INTEGER.fullmatch(within):
        raise bad_request("Invalid expiration value.")
    factor = UNIT_SECONDS.get(unit.lower())
    if factor is None:
        raise bad_request("Time unit not recognised. Supported units: days, weeks, months, years.")
    now = time.time()
    deadline = now + int(within) * factor
    expiring = []
    for item in listeners(ctx, request):
        if "certfile" not in item:
            continue
        cert = expiring_within(item["certfile"], deadline, now)
        ca = expiring_within(item["cacertfile"], deadline, now)
        if cert or ca:
            expiring.append({"node": NODE, **item, "certfile_expires_on": cert, "cacertfile_expires_on": ca})
    if expiring:
        return failed("Certificates expiring", expired=expiring)
    return ok()


# ---- routes ------------------------------------------------------------------------------------
def _alarms(ctx: AdminContext, reason: str):
    alarms = ctx.broker.alarms
    if not alarms:
        return ok()
    return failed(reason, alarms=[{"resource": ALARM_NAMES.get(name, name), "node": NODE}
                                  for name in sorted(alarms)])


@router.get("/api/health/checks/alarms", summary="503 while a resource alarm is in effect")
async def alarms(who: Principal = Who, ctx: AdminContext = Ctx):
    return _alarms(ctx, "There are alarms in effect in the cluster")


@router.get("/api/health/checks/local-alarms", summary="503 while a resource alarm is in effect on this node")
async def local_alarms(who: Principal = Who, ctx: AdminContext = Ctx):
    return _alarms(ctx, "There are alarms in effect on the node")


@router.get("/api/health/checks/port-listener/{port}", summary="503 unless a listener is on the port")
async def port_listener(port: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    port = u(port)
    if not _INTEGER.fullmatch(port):
        raise bad_request("Invalid port")
    number = int(port)
    ports = [item["port"] for item in listeners(ctx, request)]
    if number in ports:
        return ok(port=number)
    return failed("No active listener", missing=number, ports=ports)


@router.get("/api/health/checks/protocol-listener/{protocol:path}",
            summary="503 unless a listener serves the protocol (amqp, amqp/ssl or amqps, http, https)")
async def protocol_listener(protocol: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    name = normalize_protocol(u(protocol))
    protocols = [item["protocol"] for item in listeners(ctx, request)]
    if name in protocols:
        return ok(protocol=name)
    return failed("No active listener", missing=name, protocols=protocols)


@router.get("/api/health/checks/virtual-hosts", summary="503 when a vhost is down (never here)")
async def virtual_hosts(who: Principal = Who, ctx: AdminContext = Ctx):
    return ok()  # a vhost here is a dict in the broker: it cannot be down while the node runs


@router.get("/api/health/checks/node-is-quorum-critical")
async def node_is_quorum_critical(who: Principal = Who):
    return ok(reason="single node cluster")


@router.get("/api/health/checks/node-is-mirror-sync-critical")
async def node_is_mirror_sync_critical(who: Principal = Who):
    return ok(reason="single node cluster")


@router.get("/api/health/checks/certificate-expiration/{within}/{unit}",
            summary="503 when a TLS listener's certificate expires within the period")
async def certificate_expiration_check(within: str, unit: str, request: Request, who: Principal = Who,
                                       ctx: AdminContext = Ctx):
    return certificate_expiration(ctx, u(within), u(unit), request)


@router.get("/api/healthchecks/node", summary="Deprecated node health check: ok while the node runs")
async def healthchecks_node(who: Principal = Who):
    return ok()
