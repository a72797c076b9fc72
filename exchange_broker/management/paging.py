"""RabbitMQ's list query parameters: name filter, sort, columns, and page/page_size pagination."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from exchange_broker.management.common import ServiceError, bad_request

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 100


def _get_path(item: dict, path: list[str]) -> Any:
    cur: Any = item
    for part in path:
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _sort_key(value: Any) -> tuple:
    if value is None:
        return (2, 0, "")
    if isinstance(value, bool):
        return (0, int(value), "")
    if isinstance(value, (int, float)):
        return (0, value, "")
    return (1, 0, str(value))


def _columns(items: list[dict], columns: str) -> list[dict]:
    paths = [c.split(".") for c in columns.split(",") if c]
    out = []
    for item in items:
        picked: dict = {}
        for path in paths:
            value = _get_path(item, path)
            if value is None and not (len(path) == 1 and path[0] in item):
                continue
            cur = picked
            for part in path[:-1]:
                cur = cur.setdefault(part, {})
            cur[path[-1]] = value
        out.append(picked)
    return out


def _int_param(params: Mapping[str, str], key: str, default: int) -> int:
    raw = params.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise bad_request("Pagination parameters are invalid") from None


def apply(items: list[dict], params: Mapping[str, str], *, default_sort: tuple[str, ...] = (),
          paginate: bool = True) -> list[dict] | dict:
    """Filter, sort, page and pick columns of an API listing the way RabbitMQ does."""
    total = len(items)
    name = params.get("name")
    if name:
        if params.get("use_regex", "false").lower() == "true":
            try:
                rx = re.compile(name, re.IGNORECASE)
            except re.error:
                raise bad_request("Pagination parameters are invalid") from None
            items = [i for i in items if rx.search(str(i.get("name", "")))]
        else:
            needle = name.lower()
            items = [i for i in items if needle in str(i.get("name", "")).lower()]
    sort = params.get("sort")
    reverse = params.get("sort_reverse", "false").lower() == "true"
    if sort:
        keys = [s.split(".") for s in sort.split(",") if s]
        items = sorted(items, key=lambda i: tuple(_sort_key(_get_path(i, k)) for k in keys), reverse=reverse)
    elif default_sort:
        items = sorted(items, key=lambda i: tuple(_sort_key(i.get(k)) for k in default_sort),
                       reverse=reverse)
    columns = params.get("columns")
    if not (paginate and ("page" in params or "page_size" in params)):
        return _columns(items, columns) if columns else items
    page = _int_param(params, "page", 1)
    size = _int_param(params, "page_size", DEFAULT_PAGE_SIZE)
    if page < 1 or size < 1 or size > MAX_PAGE_SIZE:
        raise ServiceError(400, "invalid_pagination_parameters",
                           f"Invalid pagination parameters: page number {page}, page size {size}")
    filtered = len(items)
    page_count = math.ceil(filtered / size)
    if page > max(page_count, 1):
        raise ServiceError(400, "page_out_of_range",
                           f"Page out of range, page: {page} page size: {size}, len: {filtered}")
    chunk = items[(page - 1) * size: page * size]
    if columns:
        chunk = _columns(chunk, columns)
    return {"filtered_count": filtered, "item_count": len(chunk), "items": chunk, "page": page,
            "page_count": page_count, "page_size": size, "total_count": total}
