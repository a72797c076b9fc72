"""Resource alarms: resident memory against a high watermark, free disk against a limit."""

from __future__ import annotations

import os
import shutil
from typing import Protocol

DEFAULT_MEMORY_FRACTION = 0.4           # RabbitMQ's vm_memory_high_watermark
DEFAULT_DISK_FREE_LIMIT = 50 * 1024 ** 2  # RabbitMQ's disk_free_limit (50 MB)


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def parse_size(text: str | float | int, *, relative_to: int = 0) -> int:
    """`0.4` (a fraction of relative_to), `512MB`, `2GiB`, `1000000` (bytes)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
        return int(value * relative_to) if 0 < value < 1 and relative_to else int(value)
    s = str(text).strip().upper().replace(" ", "")
    units = {"KIB": 1024, "MIB": 1024 ** 2, "GIB": 1024 ** 3, "KB": 1000, "MB": 1000 ** 2,
             "GB": 1000 ** 3, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "B": 1}
    for unit, mult in units.items():
        if s.endswith(unit):
            return int(float(s[: -len(unit)]) * mult)
    value = float(s)
    if 0 < value < 1:
        if not relative_to:
            raise ValueError(f"a fraction needs a total to apply to: {text}")
        return int(value * relative_to)
    return int(value)


class Alarms(Protocol):
    """What the monitor needs of the broker: raise or clear a named resource alarm."""

    def set_alarm(self, name: str, on: bool, detail: str = "") -> None: ...


class ResourceMonitor:
    def __init__(self, broker: Alarms, memory_limit: int, data_dir: str | None = None,
                 disk_free_limit: int = DEFAULT_DISK_FREE_LIMIT) -> None:
        self.broker = broker
        self.memory_limit = memory_limit
        self.data_dir = data_dir
        self.disk_free_limit = disk_free_limit

    def check(self) -> None:
        if self.memory_limit:
            rss = rss_bytes()
            self.broker.set_alarm("memory", rss > self.memory_limit,
                                  f"resident memory {rss} B above the high watermark {self.memory_limit} B")
        if self.data_dir and self.disk_free_limit:
            try:
                free = shutil.disk_usage(self.data_dir).free
            except OSError:
                return
            self.broker.set_alarm("disk", free < self.disk_free_limit,
                                  f"{free} B free in {self.data_dir}, limit {self.disk_free_limit} B")
