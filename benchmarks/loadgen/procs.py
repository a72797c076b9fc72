"""Readings of a broker process from /proc: resident memory, CPU time; finding RabbitMQ's
Erlang VM (beam.smp) and raising this process's open-files limit."""
from __future__ import annotations

import os
import resource
import subprocess

CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """Resident set size (VmRSS) of ``pid`` in bytes."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of every thread of ``pid`` so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    parts = line.split()
                    if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(parts[9])
        except OSError:
            continue
    return inodes


def _owns_socket(pid: int, inodes: set[str]) -> bool:
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    except OSError:
        pass
    return False


def find_rabbit_pid(port: int = 5672) -> int | None:
    """The beam.smp process (RabbitMQ's Erlang VM), found with pgrep; when there are several,
    the one holding the listening socket of ``port``. None when there is none."""
    try:
        out = subprocess.run(["pgrep", "-x", "beam.smp"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    pids = [int(x) for x in out.split()]
    if len(pids) <= 1:
        return pids[0] if pids else None
    inodes = _listening_inodes(port)
    owners = [pid for pid in pids if _owns_socket(pid, inodes)]
    return owners[0] if owners else None


def raise_nofile(wanted: int = 0) -> int:
    """Raise the soft open-files limit to ``wanted`` (0: the hard limit); returns the new soft
    limit. Children started afterwards inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if not wanted or hard == resource.RLIM_INFINITY else min(max(wanted, soft), hard)
    if hard == resource.RLIM_INFINITY and wanted:
        target = max(wanted, soft)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def open_files_limit(pid: int) -> int | None:
    """The soft 'Max open files' of another process (e.g. RabbitMQ's), from /proc/<pid>/limits."""
    try:
        with open(f"/proc/{pid}/limits") as fh:
            for line in fh:
                if line.startswith("Max open files"):
                    value = line.split()[3]
                    return None if value == "unlimited" else int(value)
    except OSError:
        pass
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def safe_connections(pid: int, wanted: int) -> tuple[int, str]:
    """How many client connections a broker process can take without running out of file
    descriptors: at most 3/4 of its soft open-files limit minus what it has open now. RabbitMQ
    refuses sockets past ~90% of its limit and, when the limit is reached anyway, its memory
    monitor crashes on EMFILE and every later queue.declare fails with 541 until it is restarted,
    so the benchmark stays well below. Returns (connections, a note when capped)."""
    limit = open_files_limit(pid) if pid else None
    if not limit:
        return wanted, ""
    room = int(limit * 0.75) - (open_fds(pid) or 0)
    if wanted <= room:
        return wanted, ""
    return max(1, room), (f"capped at {max(1, room)} connections: the broker process (pid {pid}) "
                          f"may open {limit} files and already has {open_fds(pid)} open; "
                          "--rabbit-private measures a private node with a higher limit")
