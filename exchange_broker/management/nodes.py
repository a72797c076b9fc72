"""This node's figures for /api/nodes and the UI's overview: memory, file descriptors, sockets,
disk, alarms and listeners (RabbitMQ's field names). Read when asked, from /proc and the
resource monitor's settings; nothing here runs on the message path."""

from __future__ import annotations

import os
import resource
import shutil

from exchange_broker.management.common import NODE, AdminContext
from exchange_broker.server.resources import rss_bytes


def _fds_used() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def node_info(ctx: AdminContext, listeners: list[dict]) -> dict:
    broker = ctx.broker
    server = ctx.amqp_server
    monitor = getattr(server, "monitor", None)
    mem_limit = getattr(monitor, "memory_limit", 0) or 0
    disk_limit = getattr(monitor, "disk_free_limit", 0) or 0
    data_dir = getattr(monitor, "data_dir", None)
    disk_free = 0
    if data_dir:
        try:
            disk_free = shutil.disk_usage(data_dir).free
        except OSError:
            disk_free = 0
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "name": NODE, "type": "disc", "running": True, "uptime": ctx.uptime_ms(), "being_drained": False,
        "os_pid": str(os.getpid()), "processors": os.cpu_count() or 1,
        "mem_used": rss_bytes(), "mem_limit": mem_limit, "mem_alarm": "memory" in broker.alarms,
        "fd_used": _fds_used(), "fd_total": soft if soft != resource.RLIM_INFINITY else 0,
        "sockets_used": len(broker.sessions),
        "disk_free": disk_free, "disk_free_limit": disk_limit, "disk_free_alarm": "disk" in broker.alarms,
        "alarms": [{"resource": name, "detail": detail} for name, detail in sorted(broker.alarms.items())],
        "listeners": listeners,
    }
