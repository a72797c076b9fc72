"""Connection parameters parsed from an ``amqp[s]://`` URL.

The authority may list several nodes, ``amqp://user:pass@node1:5672,node2:5673/vhost`` (the
form libpq and MongoDB use).  ``hosts`` keeps them in order; ``Connection.connect(params,
prefer=i)`` tries them starting at node ``i`` (mod their count), so parallel partitions can
spread their connections.  With one node, ``hosts`` is just ``((host, port),)``.
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["ConnectionParams"]


def _split_hosts(netloc: str, tls: bool, url: str) -> tuple[tuple[str, int], ...]:
    default = 5671 if tls else 5672
    out = []
    for item in netloc.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"empty host in AMQP url {url!r}")
        if item.startswith("["):                        # [ipv6]:port
            host, _, rest = item[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port_text = item.rpartition(":") if ":" in item else (item, "", "")
        try:
            port = int(port_text) if port_text else default
        except ValueError:
            raise ValueError(f"bad port in AMQP url {url!r}: {port_text!r}") from None
        if not 0 < port < 65536:
            raise ValueError(f"bad port in AMQP url {url!r}: {port} is out of range")
        out.append((host or "127.0.0.1", port))
    return tuple(out)


class ConnectionParams(NamedTuple):
    host: str = "127.0.0.1"
    port: int = 5672
    vhost: str = "/"
    username: str = "guest"
    password: str = "guest"
    tls: bool = False
    heartbeat: int = 60
    connect_timeout: float = 10.0
    hosts: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_url(cls, url: str) -> "ConnectionParams":
        """Parse ``amqp[s]://user:pass@host:port[,host2:port2...]/vhost?heartbeat=N&connection_timeout=S``.

        An absent or empty path means the default vhost ``/`` (``%2F`` also works).
        """
        if not isinstance(url, str) or not url:
            raise ValueError("AMQP url is empty; expected amqp://user:pass@host:port/vhost")
        parts = urlsplit(url)
        if parts.scheme not in ("amqp", "amqps"):
            raise ValueError(f"AMQP url must start with amqp:// or amqps://, got {url!r}")
        tls = parts.scheme == "amqps"
        userinfo, _, netloc = parts.netloc.rpartition("@")
        hosts = _split_hosts(netloc, tls, url) if netloc else (("127.0.0.1", 5671 if tls else 5672),)
        user, has_pw, password = userinfo.partition(":")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        vhost = unquote(path) if path else "/"
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            heartbeat = int(query.get("heartbeat", 60))
            timeout = float(query.get("connection_timeout", query.get("connect_timeout", 10)))
        except ValueError as exc:
            raise ValueError(f"bad query parameter in AMQP url {url!r}: {exc}") from None
        return cls(host=hosts[0][0], port=hosts[0][1], vhost=vhost,
                   username=unquote(user) if userinfo else "guest",
                   password=unquote(password) if has_pw else "guest",
                   tls=tls, heartbeat=heartbeat, connect_timeout=timeout, hosts=hosts)

    def nodes(self) -> tuple[tuple[str, int], ...]:
        return self.hosts or ((self.host, self.port),)

    def redacted(self) -> str:
        scheme = "amqps" if self.tls else "amqp"
        where = ",".join(f"{h}:{p}" for h, p in self.nodes())
        return f"{scheme}://{self.username}@{where}/{self.vhost}"
