"""RabbitMQ's runtime-parameter validation (``rabbit_parameter_validation``): the checks and
their texts, shared by shovels and federation upstreams. A refused value raises
:class:`ParameterError` whose ``reason`` is what the API answers in its 400."""

from __future__ import annotations

from typing import Callable

from exchange_broker.core.policy_defs import erl
from exchange_broker.movers import uris


class ParameterError(ValueError):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.reason = f"Validation failed\n\n{text}\n"


def number(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ParameterError(f"{name} should be a number, actually was {erl(v)}")


def binary(name: str, v) -> None:
    if not isinstance(v, str):
        raise ParameterError(f"{name} should be binary, actually was {erl(v)}")


def boolean(name: str, v) -> None:
    if not isinstance(v, bool):
        raise ParameterError(f"{name} should be boolean, actually was {erl(v)}")


def table(name: str, v) -> None:
    if not isinstance(v, dict):
        raise ParameterError(f"{name} should be a table, actually was {erl(v)}")


def enum(*allowed: str) -> Callable[[str, object], None]:
    def check(name: str, v) -> None:
        if v not in allowed:
            raise ParameterError(f"{name} should be one of [{','.join(allowed)}], actually was {erl(v)}")
    return check


def uri(name: str, v) -> None:
    """A URI or a non-empty list of them."""
    if isinstance(v, list):
        if not v:
            raise ParameterError(f"{name} should be a non-empty list, actually was []")
        for item in v:
            uri(name, item)
        return
    if not isinstance(v, str):
        raise ParameterError(f"{name} should be binary, actually was {erl(v)}")
    try:
        uris.parse(v)
    except uris.UriError as exc:
        raise ParameterError(f'"{v}" not a valid URI: {exc}') from None


def proplist(name: str, rules: dict, value) -> None:
    """``rules``: key -> (check, mandatory). Unknown keys and missing mandatory ones are refused."""
    if not isinstance(value, dict):
        raise ParameterError(f"{name} should be a JSON object, actually was {erl(value)}")
    for key, (check, mandatory) in rules.items():
        if key in value:
            check(key, value[key])
        elif mandatory:
            raise ParameterError(f'Key "{key}" not found in {name}')
    unknown = {k: v for k, v in value.items() if k not in rules}  # printed as a proplist
    if unknown:
        raise ParameterError(f"Unrecognised terms {erl(list(unknown.items()))} in {name}")
