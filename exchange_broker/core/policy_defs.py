"""Policies and operator policies as values: what one is, and RabbitMQ 3.13's validation of one.

A policy is a vhost-scoped runtime parameter (component ``policy`` or ``operator_policy``) whose
value is ``{"pattern", "apply-to", "priority", "definition"}``. :func:`parse_policy` checks a value
the way RabbitMQ does (``rabbit_policy``, ``rabbit_policies``, ``rabbit_mirror_queue_misc``,
``rabbit_parameter_validation``) and raises :class:`PolicyError` with RabbitMQ's text:
``"Validation failed\\n\\n<one line per error>\\n"``, values printed as Erlang terms
(``<<"x">> is not a valid message TTL``).

Pure: no IO. Matching and precedence are in ``core/policies.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

POLICY = "policy"
OPERATOR_POLICY = "operator_policy"
KINDS = (POLICY, OPERATOR_POLICY)
APPLY_TO = ("all", "exchanges", "queues", "classic_queues", "quorum_queues", "streams")

MAX_STREAM_SEGMENT = 3_000_000_000
MAX_AGE_UNITS_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000,
                    "m": 60_000, "s": 1000}
HA_KEYS = ("ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size", "ha-promote-on-shutdown",
           "ha-promote-on-failure")
HA_OPERATOR_KEYS = ("ha-mode", "ha-params", "ha-sync-mode")


class PolicyError(ValueError):
    """A refused policy; ``reason`` is RabbitMQ's whole text."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        self.reason = "Validation failed\n\n" + "".join(e + "\n" for e in errors)
        super().__init__(self.reason)


@dataclass
class Policy:
    kind: str                 # POLICY or OPERATOR_POLICY
    vhost: str
    name: str
    pattern: str
    apply_to: str
    priority: int | float
    definition: dict
    regex: re.Pattern = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    def value(self) -> dict:
        """The runtime parameter's value, as RabbitMQ stores it."""
        return {"pattern": self.pattern, "apply-to": self.apply_to, "priority": self.priority,
                "definition": dict(self.definition)}

    def info(self) -> dict:
        """The management API's (and the definitions export's) shape."""
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern,
                "apply-to": self.apply_to, "definition": dict(self.definition),
                "priority": self.priority}


# ---- Erlang term printing (the ~tp of RabbitMQ's messages) --------------------------------------
def erl(value: Any) -> str:
    """A JSON value as Erlang prints the term RabbitMQ decoded it to."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _erl_float(value)
    if isinstance(value, str):
        return _erl_binary(value)
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        return "#{" + ",".join(f"{erl(k)} => {erl(v)}" for k, v in items) + "}"
    if isinstance(value, tuple):
        return "{" + ",".join(erl(v) for v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(erl(v) for v in value) + "]"
    return str(value)


def _erl_binary(text: str) -> str:
    escaped = []
    for ch in text:
        if ch in '"\\':
            escaped.append("\\" + ch)
        elif ch == "\n":
            escaped.append("\\n")
        elif ch == "\t":
            escaped.append("\\t")
        elif ord(ch) < 32:
            escaped.append(f"\\{ord(ch):o}")
        else:
            escaped.append(ch)
    suffix = "/utf8" if any(ord(ch) > 127 for ch in text) else ""
    return f'<<"{"".join(escaped)}"{suffix}>>'


def _erl_float(value: float) -> str:
    text = repr(value)
    if "e" not in text:
        return text if "." in text else text + ".0"
    mantissa, exp = text.split("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}e{int(exp)}"


def escape_html(text: str) -> str:
    """rabbit_mgmt_format:escape_html_tags/1 (the policy endpoint escapes its error text)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---- definition keys -----------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_key(lo: int, hi: int | None, what: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if _is_int(v) and v >= lo and (hi is None or v <= hi):
            return None
        return f"{erl(v)} {what}"
    return check


def _str_key(what: str) -> Callable[[Any], str | None]:
    return lambda v: None if isinstance(v, str) else f"{erl(v)} {what}"


def _enum_key(options: tuple, what: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        ok = any(v == o and type(v) is type(o) for o in options)
        return None if ok else f"{erl(v)} {what}"
    return check


def max_age_ms(value: Any) -> int | None:
    """rabbit_amqqueue:check_max_age/1: ``<positive integer><Y|M|D|h|m|s>`` in ms, or None."""
    if not isinstance(value, str):
        return None
    m = re.fullmatch(r"([0-9]+)(Y|M|D|h|m|s)", value)
    if m is None or int(m.group(1)) <= 0:
        return None
    return int(m.group(1)) * MAX_AGE_UNITS_MS[m.group(2)]


def _max_age(v: Any) -> str | None:
    return None if max_age_ms(v) is not None else f"{erl(v)} is not a valid max age"


KEY_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "alternate-exchange": _str_key("is not a valid alternate exchange name"),
    "consumer-timeout": _int_key(0, None, "is not a valid consumer timeout"),
    "dead-letter-exchange": _str_key("is not a valid dead letter exchange name"),
    "dead-letter-routing-key": _str_key("is not a valid dead letter routing key"),
    "dead-letter-strategy": _enum_key(("at-most-once", "at-least-once"), "is not a valid dead letter strategy"),
    "message-ttl": _int_key(0, None, "is not a valid message TTL"),
    "expires": _int_key(1, None, "is not a valid queue expiry"),
    "max-length": _int_key(0, None, "is not a valid maximum length"),
    "max-length-bytes": _int_key(0, None, "is not a valid maximum length in bytes"),
    "max-in-memory-length": _int_key(0, None, "is not a valid maximum memory in bytes"),
    "max-in-memory-bytes": _int_key(0, None, "is not a valid maximum memory in bytes"),
    "queue-mode": _enum_key(("default", "lazy"), "is not a valid queue-mode value"),
    "queue-version": _enum_key((1, 2), "is not a valid queue-version value"),
    "overflow": _enum_key(("drop-head", "reject-publish", "reject-publish-dlx"), "is not a valid overflow value"),
    "delivery-limit": _int_key(-2 ** 63, None, "is not a valid delivery limit"),  # 4.x: -1 lifts it
    "max-age": _max_age,
    "stream-max-segment-size-bytes": _int_key(0, MAX_STREAM_SEGMENT, "is not a valid segment size"),
    "stream-filter-size-bytes": _int_key(16, 255, "is not a valid filter size. Valid range is 16-255"),
    "queue-leader-locator": _enum_key(("client-local", "balanced", "random", "least-leaders"),
                                      "is not a valid queue leader locator value"),
    "initial-cluster-size": _int_key(0, None, "is not a valid cluster size"),
    "target-group-size": _int_key(1, None, "is not a valid qq target count value"),
    "federation-upstream-set": _str_key("is not a valid federation upstream set name"),
    "federation-upstream": _str_key("is not a valid federation upstream name"),
}
OPERATOR_KEYS = frozenset(("expires", "message-ttl", "max-length", "max-length-bytes", "max-in-memory-length",
                           "max-in-memory-bytes", "delivery-limit", "queue-version", "overflow",
                           "target-group-size"))


def _check_ha(defn: dict) -> str | None:
    """rabbit_mirror_queue_misc:validate_policy/1 (classic mirroring: accepted, no effect here)."""
    if "ha-mode" not in defn:
        return "ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown"
    mode, params = defn["ha-mode"], defn.get("ha-params")
    if mode not in ("all", "exactly", "nodes") or not isinstance(mode, str):
        return f"{erl(mode)} is not a valid ha-mode value"
    if mode == "all" and "ha-params" in defn:
        return 'ha-mode="all" does not take parameters'
    if mode == "exactly" and not (_is_int(params) and params > 0):
        return f'ha-mode="exactly" takes an integer, {erl(params)} given'
    if mode == "nodes":
        if params == []:
            return 'ha-mode="nodes" list must be non-empty'
        if not isinstance(params, list):
            return f'ha-mode="nodes" takes a list, {erl(params)} given'
        bad = [n for n in params if not isinstance(n, str)]
        if bad:
            return f'ha-mode="nodes" takes a list of strings, {erl(bad)} was not a string'
    sync = defn.get("ha-sync-mode", "manual")
    if sync not in ("manual", "automatic") or not isinstance(sync, str):
        return f'ha-sync-mode must be "manual" or "automatic", got {erl(sync)}'
    if "ha-sync-batch-size" in defn:
        size = defn["ha-sync-batch-size"]
        if not (_is_int(size) and size > 0):
            return f"ha-sync-batch-size takes an integer greater than 0, {erl(size)} given"
    for key in ("ha-promote-on-shutdown", "ha-promote-on-failure"):
        value = defn.get(key, "always")
        if value not in ("always", "when-synced") or not isinstance(value, str):
            return f'{key} must be "always" or "when-synced", got {erl(value)}'
    return None


def check_definition(kind: str, definition: Any) -> str | None:
    """The definition's first error (None: valid), as rabbit_policy:validation/3."""
    if isinstance(definition, (dict, list)) and not definition:
        return "no policy provided"
    if not isinstance(definition, dict):
        return f"definition must be a dictionary: {erl(definition)}"
    operator = kind == OPERATOR_POLICY
    keys = OPERATOR_KEYS if operator else KEY_CHECKS.keys()
    ha_keys = HA_OPERATOR_KEYS if operator else HA_KEYS
    unknown = []
    ha_checked = False
    for key in sorted(definition):
        if key in ha_keys:
            if not ha_checked:
                ha_checked = True
                error = _check_ha({k: v for k, v in definition.items() if k in ha_keys})
                if error:
                    return error
        elif key in keys:
            error = KEY_CHECKS[key](definition[key])
            if error:
                return error
        else:
            unknown.append((key, definition[key]))
    if unknown:
        return f"{erl(unknown)} are not recognised policy settings"
    return None


# ---- the whole value -------------------------------------------------------------------------------
def _regex_error(exc: re.error) -> str:
    msg = str(exc.msg) if getattr(exc, "msg", None) else str(exc)
    return f'{{"{msg}",{exc.pos or 0}}}'


def compile_pattern(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def parse_policy(kind: str, vhost: str, name: str, pattern: Any, definition: Any,
                 priority: Any = None, apply_to: Any = None) -> Policy:
    """Check a policy as ``rabbit_policy:set/8`` does (priority defaults to 0, apply-to to
    ``all``) and build it; :class:`PolicyError` lists every error in RabbitMQ's order."""
    if kind not in KINDS:
        raise ValueError(f"unknown policy kind {kind!r}")
    priority = 0 if priority is None else priority
    apply_to = "all" if apply_to is None else apply_to
    errors = []
    error = check_definition(kind, definition)
    if error:
        errors.append(error)
    if apply_to not in APPLY_TO:
        shown = apply_to if isinstance(apply_to, str) else erl(apply_to)
        errors.append(f"apply-to '{shown}' unrecognised; should be one of: 'queues', 'classic_queues',  "
                      f"'quorum_queues', 'streams', 'exchanges', or 'all'")
    regex = None
    if not isinstance(pattern, str):
        errors.append(f"pattern should be a binary but was {erl(pattern)}")
    else:
        try:
            regex = compile_pattern(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            why = _regex_error(exc) if isinstance(exc, re.error) else f'{{"{exc}",0}}'
            errors.append(f"pattern should be regular expression but is invalid: {why}")
    if isinstance(priority, bool) or not isinstance(priority, (int, float)):
        errors.append(f"priority should be a number, actually was {erl(priority)}")
    if errors:
        raise PolicyError(errors)
    # keys in Erlang's map order (sorted), as RabbitMQ shows and exports them
    return Policy(kind, vhost, name, pattern, apply_to, priority, dict(sorted(definition.items())), regex)
