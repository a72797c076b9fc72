#!/usr/bin/env python3
"""Scale check for the delayed-message exchange: N pending delayed messages at once.

Starts ``exchange-broker serve`` as a subprocess (SQLite store in a temp dir by default,
``--in-memory`` for the store-less broker, or ``--port`` to use a running broker), declares a
durable ``x-delayed-message`` exchange (x-delayed-type direct) bound to a transient queue, and
publishes N persistent messages with publisher confirms through the lean raw-frame client of
``amqp_load.py``. Due times are spread evenly over ``--spread`` seconds starting ``--lead``
seconds after the start, in a scrambled order (publish order is not due order), so that once
publishing ends all N are pending. A no-ack consumer then measures each delivery's lateness.

Lateness is measured against the due time the *client* computed (encode time + x-delay); the
broker starts the delay when the publish arrives, a little later, so the figures are an upper
bound: they include the publish's client-to-broker transit time. Publishing is therefore paced
(``--rate``, small ``--batch``) below what the broker sustains, so that no backlog builds up
between client and broker; with ``--rate 0`` the figures mostly measure that backlog.

Reports publish/confirm rate, the broker's RSS (peak while publishing, with N pending, and
during delivery), rows in the store, and lateness percentiles.

    python benchmarks/delayed_bench.py --count 1000000
    python benchmarks/delayed_bench.py --count 200000 --in-memory --json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from amqp_load import FRAME_BODY, FRAME_HEADER, FRAME_METHOD, Connection, _frame, _shortstr  # noqa: E402
from pamqp import commands  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
_BODY = struct.Struct(">dQ")  # client-side due time (epoch s), index


def _table_delay(delay_ms: int) -> bytes:
    entry = b"\x07x-delay" + b"I" + struct.pack(">i", delay_ms)
    return struct.pack(">I", len(entry)) + entry


def encode_delayed(exchange_sh: bytes, rk_sh: bytes, body: bytes, delay_ms: int) -> bytes:
    method = struct.pack(">HHH", 60, 40, 0) + exchange_sh + rk_sh + b"\x00"
    # property flags: headers (bit 13) + delivery-mode (bit 12); headers first, then mode 2
    header = struct.pack(">HHQH", 60, 0, len(body), 0x3000) + _table_delay(delay_ms) + b"\x02"
    return (_frame(FRAME_METHOD, 1, method) + _frame(FRAME_HEADER, 1, header)
            + _frame(FRAME_BODY, 1, body))


class LatenessConsumer(Connection):
    """Counts deliveries and records now - due for each (the due time rides in the body)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.verify = True  # routes delivery bodies through _verify_body
        self.lateness: list[float] = []
        self.indexes: list[int] = []
        self.first_at = 0.0
        self.last_at = 0.0

    def _verify_header(self, buf, off):
        pass

    def _verify_body(self, buf, off, size):
        if self._v_need_seq:
            self._v_need_seq = False
            now = time.time()
            if not self.first_at:
                self.first_at = now
            self.last_at = now
            due, index = _BODY.unpack_from(buf, off)
            self.lateness.append((now - due) * 1000.0)
            self.indexes.append(index)


class ConfirmTimes(Connection):
    """A producer that notes when each publish was sent and when its confirm arrived."""

    def __init__(self, name: str, n: int) -> None:
        super().__init__(name)
        self.sent = array("d", bytes(8 * n))
        self.acked_at = array("d", bytes(8 * n))
        self._marked = 0  # acked_at is filled for tags 1..this

    def _on_confirm(self, tag, multiple, is_ack):
        super()._on_confirm(tag, multiple, is_ack)
        water = self._c_water  # every tag up to here is confirmed (later singles count later)
        if water > self._marked:
            now = time.time()
            acked = self.acked_at
            for i in range(self._marked, water):
                acked[i] = now
            self._marked = water


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (FileNotFoundError, IndexError, ValueError):
        return 0.0


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except FileNotFoundError:
        pass
    return 0.0


def start_broker(opts, workdir: Path) -> tuple[subprocess.Popen, int]:
    port_file = workdir / "port"
    args = [sys.executable, "-m", "exchange_broker", "serve", "--host", "127.0.0.1", "--port", "0",
            "--port-file", str(port_file), "--heartbeat", "0", "--log-level", "INFO",
            "--admin-port", "0"]
    if opts.in_memory:
        args.append("--in-memory")
    elif opts.database_url:
        args += ["--database-url", opts.database_url]
    else:
        args += ["--data-dir", str(workdir / "data"), "--sqlite-synchronous", opts.sqlite_synchronous]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    log = open(workdir / "broker.log", "wb")
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                            cwd=str(REPO), env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"broker exited: {(workdir / 'broker.log').read_text()[-3000:]}")
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text())
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("broker did not start")


def pct(sorted_vals: list[float], p: float) -> float:
    if not sorted_vals:
        return float("nan")
    return sorted_vals[min(len(sorted_vals) - 1, int(p / 100.0 * len(sorted_vals)))]


async def bench(opts, port: int, pid: int | None) -> dict:
    n = opts.count
    prod, cons = ConfirmTimes("producer", n), LatenessConsumer("consumer")
    for c in (prod, cons):
        await c.open("127.0.0.1", port, "guest", "guest", "/", 0, 10)
    exchange = f"delayed-bench-{os.getpid()}"
    queue = exchange + "-q"
    await prod.rpc(commands.Exchange.Declare(exchange=exchange, exchange_type="x-delayed-message",
                                             durable=True, arguments={"x-delayed-type": "direct"}),
                   "Exchange.DeclareOk")
    await prod.rpc(commands.Queue.Declare(queue=queue, durable=False, auto_delete=False),
                   "Queue.DeclareOk")
    await prod.rpc(commands.Queue.Bind(queue=queue, exchange=exchange, routing_key="k"),
                   "Queue.BindOk")
    await prod.rpc(commands.Confirm.Select(), "Confirm.SelectOk")
    await cons.rpc(commands.Basic.Consume(queue=queue, no_ack=True), "Basic.ConsumeOk")

    rss: list[tuple[float, float]] = []
    stop_sampling = asyncio.Event()

    async def sample():
        while not stop_sampling.is_set() and pid:
            rss.append((time.time(), rss_mb(pid)))
            try:
                await asyncio.wait_for(stop_sampling.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
    sampler = asyncio.create_task(sample())

    ex_sh, rk_sh = _shortstr(exchange), _shortstr("k")
    pad = b"\x00" * max(0, opts.size - _BODY.size)
    t_start = time.time()
    first_due = t_start + opts.lead
    golden = 0.6180339887498949
    window, batch = opts.window, opts.batch
    published = 0
    transport = prod.transport
    while published < n:
        room = window - (published - prod.confirmed - prod.nacked)
        if room <= 0:
            prod.confirm_event.clear()
            await prod.confirm_event.wait()
            if prod.error:
                raise prod.error
            continue
        if not prod.writable.is_set():
            await prod.writable.wait()
            continue
        if opts.rate:
            ahead = t_start + published / opts.rate - time.time()
            if ahead > 0:
                await asyncio.sleep(ahead)
                continue
        k = min(batch, room, n - published)
        now = time.time()
        out = []
        sent = prod.sent
        for i in range(published, published + k):
            sent[i] = now
            due = first_due + ((i * golden) % 1.0) * opts.spread
            delay = max(1, int((due - now) * 1000) + 1)
            out.append(encode_delayed(ex_sh, rk_sh, _BODY.pack(now + delay / 1000.0, i) + pad, delay))
        transport.write(b"".join(out))
        published += k
        await asyncio.sleep(0)
    while prod.confirmed + prod.nacked < n and prod.error is None:
        prod.confirm_event.clear()
        await prod.confirm_event.wait()
    t_published = time.time()
    cpu_published = cpu_seconds(pid) if pid else 0.0
    pending_rss = rss_mb(pid) if pid else 0.0
    delivered_during_publish = len(cons.lateness)
    last_due = first_due + opts.spread
    expected = n
    if opts.measure:  # only the messages due in the first --measure seconds of the spread
        last_due = min(last_due, first_due + opts.measure)
        expected = sum(1 for i in range(n) if ((i * golden) % 1.0) * opts.spread <= opts.measure)
    t_cpu0 = time.time()
    cpu0 = cpu_seconds(pid) if pid else 0.0
    deadline = max(last_due, time.time()) + opts.grace
    while len(cons.lateness) < expected and time.time() < deadline and cons.error is None:
        await asyncio.sleep(0.2)
    t_done = time.time()
    cpu_delivery = (cpu_seconds(pid) - cpu0) / max(1e-9, t_done - t_cpu0) if pid else 0.0
    stop_sampling.set()
    await sampler
    for c in (prod, cons):
        await c.close()

    late = sorted(cons.lateness)
    # the broker's due time is between (send + delay) and (confirm + delay): a lower bound too
    sent, acked = prod.sent, prod.acked_at
    low = sorted(lat - (acked[i] - sent[i]) * 1000.0 if acked[i] else lat
                 for lat, i in zip(cons.lateness, cons.indexes))
    transit = sorted((acked[i] - sent[i]) * 1000.0 for i in range(n) if acked[i])
    pub_rss = [m for t, m in rss if t <= t_published]
    all_rss = [m for _, m in rss]
    return {
        "count": n, "size": opts.size, "store": "memory" if opts.in_memory else
        (opts.database_url or f"sqlite (synchronous={opts.sqlite_synchronous})"),
        "publish_rate_target": opts.rate,
        "publish_seconds": round(t_published - t_start, 2),
        "broker_cpu_publishing": round(cpu_published / max(1e-9, t_published - t_start), 2),
        "broker_cpu_delivering": round(cpu_delivery, 2),
        "publish_confirmed_per_s": round(n / (t_published - t_start)),
        "confirmed": prod.confirmed, "nacked": prod.nacked,
        "expected": expected, "delivered": len(late),
        "delivered_before_publish_end": delivered_during_publish,
        "delivery_seconds": round(cons.last_at - cons.first_at, 2) if late else 0,
        "rss_mb_start": round(all_rss[0], 1) if all_rss else None,
        "rss_mb_peak_publishing": round(max(pub_rss), 1) if pub_rss else None,
        "rss_mb_all_pending": round(pending_rss, 1),
        "rss_mb_peak": round(max(all_rss), 1) if all_rss else None,
        "lateness_ms": {"min": round(late[0], 2) if late else None,
                        "p50": round(pct(late, 50), 2), "p90": round(pct(late, 90), 2),
                        "p99": round(pct(late, 99), 2), "p99.9": round(pct(late, 99.9), 2),
                        "max": round(late[-1], 2) if late else None},
        "lateness_ms_lower_bound": {"p50": round(pct(low, 50), 2), "p90": round(pct(low, 90), 2),
                                    "p99": round(pct(low, 99), 2), "p99.9": round(pct(low, 99.9), 2),
                                    "max": round(low[-1], 2) if low else None},
        "publish_to_confirm_ms": {"p50": round(pct(transit, 50), 2), "p99": round(pct(transit, 99), 2),
                                  "max": round(transit[-1], 2) if transit else None},
        "wall_seconds": round(t_done - t_start, 1),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=32, help="body bytes (>= 16)")
    p.add_argument("--lead", type=float, default=None,
                   help="seconds from start to the first due time (default: count/rate + 10)")
    p.add_argument("--spread", type=float, default=None,
                   help="due times spread over this many seconds (default: count/8000, min 10)")
    p.add_argument("--grace", type=float, default=60.0, help="wait this long after the last due time")
    p.add_argument("--measure", type=float, default=0.0,
                   help="stop after the messages due in the first SECONDS of the spread (the rest "
                        "stay pending and are dropped with the broker); 0: deliver everything")
    p.add_argument("--window", type=int, default=1000, help="max unconfirmed publishes")
    p.add_argument("--batch", type=int, default=50, help="publishes per socket write")
    p.add_argument("--rate", type=float, default=10000.0,
                   help="publishes per second (0: as fast as confirms allow). Keep it below what "
                        "the broker sustains, or the lateness figures include publish backlog")
    p.add_argument("--in-memory", action="store_true", help="broker without a store")
    p.add_argument("--database-url", default=None)
    p.add_argument("--sqlite-synchronous", default="FULL", choices=("FULL", "NORMAL", "OFF"))
    p.add_argument("--port", type=int, default=0, help="use a running broker on 127.0.0.1:PORT")
    p.add_argument("--pid", type=int, default=0, help="its pid, for RSS (with --port)")
    p.add_argument("--json", action="store_true")
    return p


def main(argv=None) -> int:
    opts = build_parser().parse_args(argv)
    if opts.lead is None:
        opts.lead = opts.count / (opts.rate or 15000) + 10
    if opts.spread is None:
        opts.spread = max(10.0, opts.count / 8000)
    workdir = Path(tempfile.mkdtemp(prefix="delayed-bench-"))
    proc = None
    result: dict = {}
    try:
        if opts.port:
            port, pid = opts.port, opts.pid or None
        else:
            proc, port = start_broker(opts, workdir)
            pid = proc.pid
        try:
            import uvloop
            runner = uvloop.run
        except ImportError:
            runner = asyncio.run
        result = runner(bench(opts, port, pid))
        result["lead_s"], result["spread_s"] = opts.lead, opts.spread
        if proc is not None and not opts.in_memory and not opts.database_url:
            db = workdir / "data" / "broker.db"
            result["sqlite_db_mb_end"] = round(sum(f.stat().st_size for f in db.parent.glob("broker.db*"))
                                               / 2 ** 20, 1)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log = (workdir / "broker.log").read_text(errors="replace")
            if "Traceback" in log or "ERROR" in log:
                print(log[-3000:], file=sys.stderr)
            for line in log.splitlines():  # the broker's own counters, logged at shutdown
                if "delayed messages:" in line:
                    result["broker_delayed"] = line.split("delayed messages:", 1)[1].strip()
        shutil.rmtree(workdir, ignore_errors=True)
    if opts.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k:>30}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
