"""Users and RabbitMQ-compatible password hashing (rabbit_password_hashing_sha256)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass, field

HASHING_SHA256 = "rabbit_password_hashing_sha256"
HASHING_SHA512 = "rabbit_password_hashing_sha512"
HASHING_MD5 = "rabbit_password_hashing_md5"
_ALGOS = {HASHING_SHA256: hashlib.sha256, HASHING_SHA512: hashlib.sha512, HASHING_MD5: hashlib.md5}


def is_loopback(host: str | None) -> bool:
    """A peer on this host (IPv4, IPv6 or IPv4-mapped loopback); no address at all (an in-process
    connection) counts as local. RabbitMQ's loopback-only users may log in from such peers only."""
    if not host:
        return True
    return host.startswith("127.") or host in ("::1", "localhost") or host.startswith("::ffff:127.")


def hash_password(password: str, algorithm: str = HASHING_SHA256, salt: bytes | None = None) -> str:
    """base64(salt ++ H(salt ++ utf8(password))) with a 4-byte salt, as RabbitMQ stores it."""
    salt = os.urandom(4) if salt is None else salt
    digest = _ALGOS[algorithm](salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def check_password(password: str, password_hash: str, algorithm: str = HASHING_SHA256) -> bool:
    if not password_hash:
        return False  # RabbitMQ: a user without a password cannot log in with one
    try:
        raw = base64.b64decode(password_hash)
    except ValueError:
        return False
    algo = _ALGOS.get(algorithm)
    if algo is None or len(raw) < 5:
        return False
    salt = raw[:4]
    return hmac.compare_digest(raw, salt + algo(salt + password.encode("utf-8")).digest())


@dataclass
class User:
    name: str
    password_hash: str
    hashing_algorithm: str = HASHING_SHA256
    tags: list[str] = field(default_factory=list)

    def check(self, password: str) -> bool:
        return check_password(password, self.password_hash, self.hashing_algorithm)
