#!/usr/bin/env python3
"""Benchmark this project's broker against RabbitMQ with amqp_load.py.

1. starts ``exchange-broker serve --host 127.0.0.1 --port P --admin-port 0``
   (plus any --broker-arg / arguments after ``--``) on a free port, in its
   own process group, with its output going to a log file;
   By default it gets ``--data-dir <tmpdir>/data`` and runs in <tmpdir>,
   a temporary directory removed at the end;
2. waits until the port accepts connections, runs the chosen scenario(s)
   with amqp_load.py (as a separate process), then stops the broker;
3. runs the same scenario(s) against RabbitMQ at 127.0.0.1:5672 when it is
   reachable (otherwise says so and skips it);
4. prints a table: broker, msgs/s, ratio ours/RabbitMQ.

The broker is always terminated at the end, also on errors and Ctrl-C.

Examples::

    python benchmarks/compare.py --scenario transient
    python benchmarks/compare.py --scenario all --seconds 10
    python benchmarks/compare.py --scenario confirms -- --sqlite-synchronous NORMAL
    python benchmarks/compare.py --scenario confirms \\
        --broker-arg=--database-url --broker-arg=sqlite:///{tmpdir}/broker.db
    python benchmarks/compare.py -- --log-level warning   # extra broker args

``--broker-cmd`` replaces the command (default: ``exchange-broker serve``,
or ``python -c 'from exchange_broker.cli import main...' serve`` from the
repository when the script is not installed).  If the command contains
``{port}`` it is used as a complete template and no --host/--port/
--admin-port flags are appended; ``{host}``, ``{port}`` and ``{tmpdir}`` are
substituted in the command and in every broker argument.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LOAD = os.path.join(HERE, "amqp_load.py")
SCENARIOS = ("transient", "confirms")
STORE_FLAGS = ("--data-dir", "--database-url", "--in-memory")


class BrokerFailed(RuntimeError):
    pass


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def default_broker_cmd() -> list[str]:
    exe = shutil.which("exchange-broker")
    if exe:
        return [exe, "serve"]
    return [sys.executable, "-c",
            "import sys; from exchange_broker.cli import main; sys.exit(main())",
            "serve"]


def tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()[-16384:]
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Broker:
    """Our broker as a subprocess in its own process group."""

    def __init__(self, cmd: list[str], host: str, port: int, log_path: str, cwd: str):
        self.cmd, self.host, self.port = cmd, host, port
        self.log_path, self.cwd = log_path, cwd
        self.proc: subprocess.Popen | None = None

    def start(self, startup_timeout: float) -> None:
        log = open(self.log_path, "ab")
        try:
            env = dict(os.environ)
            env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"]
                                        if env.get("PYTHONPATH") else "")
            env.setdefault("PYTHONUNBUFFERED", "1")
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.cwd,
                                         env=env, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise BrokerFailed(f"broker exited with code {rc} during startup")
            if port_open(self.host, self.port, 0.25):
                return
            time.sleep(0.1)
        raise BrokerFailed(f"broker did not accept connections on port {self.port} "
                           f"within {startup_timeout:.0f} s")

    def stop(self, grace: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        # our own child, started with start_new_session=True: its pgid is its pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def run_load(scenario: str, host: str, port: int, args, extra: list[str]) -> dict:
    cmd = [sys.executable, LOAD, "--scenario", scenario, "--host", host,
           "--port", str(port), "--user", args.user, "--password", args.password,
           "--vhost", args.vhost, "--seconds", str(args.seconds),
           "--warmup", str(args.warmup), "--size", str(args.size), "--json", *extra]
    timeout = args.seconds + 120 if "--verify" not in extra else 900
    try:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             timeout=timeout, text=True)
    except subprocess.TimeoutExpired:
        return {"scenario": scenario, "error": f"amqp_load timed out after {timeout} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"scenario": scenario,
                "error": f"amqp_load exited {out.returncode} without a result"}
    result = json.loads(lines[-1])
    result["exit_code"] = out.returncode
    return result


def median_result(results: list[dict]) -> dict:
    ok = [r for r in results if "error" not in r]
    if not ok:
        return results[-1]
    if len(ok) == 1:
        return ok[0]
    ok.sort(key=lambda r: r.get("consumed_per_s") or 0)
    med = dict(ok[len(ok) // 2])
    med["runs"] = [r.get("consumed_per_s") for r in results if "error" not in r]
    med["consumed_per_s"] = statistics.median(med["runs"])
    conf = [r.get("confirmed_per_s") for r in ok if r.get("confirmed_per_s") is not None]
    if conf:
        med["confirmed_per_s"] = statistics.median(conf)
    return med


def bench_target(label, host, port, scenarios, args, extra) -> dict[str, dict]:
    out = {}
    for sc in scenarios:
        runs = []
        for i in range(args.runs):
            print(f"[{label}] {sc} run {i + 1}/{args.runs} ...", file=sys.stderr, flush=True)
            r = run_load(sc, host, port, args, extra)
            runs.append(r)
            if "error" in r:
                print(f"[{label}] {sc}: {r['error']}", file=sys.stderr)
                break
            print(f"[{label}] {sc}: consumed {r.get('consumed_per_s', 0):,.0f}/s"
                  + (f", confirmed {r['confirmed_per_s']:,.0f}/s"
                     if r.get("confirmed_per_s") is not None else "")
                  + (f", verify {'OK' if r['verify_ok'] else 'FAILED'}"
                     if "verify_ok" in r else ""),
                  file=sys.stderr, flush=True)
        out[sc] = median_result(runs)
    return out


def fmt_rate(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def fmt_ratio(a, b) -> str:
    if a is None or not b:
        return "-"
    return f"{a / b:.2f}"


def print_table(scenarios, ours: dict, rabbit: dict | None, ours_name: str) -> None:
    rows = [("scenario", "broker", "msgs/s", "confirmed/s", "ours/RabbitMQ")]
    for sc in scenarios:
        o = ours.get(sc, {})
        r = (rabbit or {}).get(sc)
        o_rate, o_conf = o.get("consumed_per_s"), o.get("confirmed_per_s")
        ratio = "-"
        if r and "error" not in r and "error" not in o:
            ratio = fmt_ratio(o_rate, r.get("consumed_per_s"))
            if o_conf is not None and r.get("confirmed_per_s"):
                ratio += f" (conf {fmt_ratio(o_conf, r['confirmed_per_s'])})"
        rows.append((sc, ours_name, "error" if "error" in o else fmt_rate(o_rate),
                     fmt_rate(o_conf), ratio))
        if r is not None:
            rname = r.get("server") or "RabbitMQ"
            rows.append((sc, rname, "error" if "error" in r else
                         fmt_rate(r.get("consumed_per_s")),
                         fmt_rate(r.get("confirmed_per_s")), "1.00"))
        elif rabbit is None:
            rows.append((sc, "RabbitMQ", "skipped", "-", "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print("msgs/s = messages consumed per second (after warm-up); "
          "ratio = ours / RabbitMQ")


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Run amqp_load.py against this project's broker and RabbitMQ.",
        epilog="Arguments after a bare '--' are appended to the broker command line.")
    p.add_argument("--scenario", default="transient",
                   help="transient, confirms, all, or a comma list (default transient)")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--runs", type=int, default=1,
                   help="runs per scenario and broker; the median is reported")
    p.add_argument("--user", default="guest")
    p.add_argument("--password", default="guest")
    p.add_argument("--vhost", default="/")
    p.add_argument("--broker-cmd", default=None,
                   help="broker command (shell-quoted); default 'exchange-broker serve'")
    p.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                   help="extra broker argument, repeatable; use the = form for "
                        "dashed values: --broker-arg=--data-dir --broker-arg={tmpdir}/data")
    p.add_argument("--no-temp-data-dir", action="store_true",
                   help="don't add --data-dir {tmpdir}/data (added by default unless "
                        "--data-dir, --database-url or --in-memory is given)")
    p.add_argument("--no-admin-port", action="store_true",
                   help="do not pass --admin-port 0 (it is also dropped automatically "
                        "if the broker CLI rejects it)")
    p.add_argument("--broker-log", default=None,
                   help="keep the broker's output in this file (default: temp dir)")
    p.add_argument("--startup-timeout", type=float, default=30.0)
    p.add_argument("--rabbit-host", default="127.0.0.1")
    p.add_argument("--rabbit-port", type=int, default=5672)
    p.add_argument("--rabbit-user", default=None, help="default: --user")
    p.add_argument("--rabbit-password", default=None, help="default: --password")
    p.add_argument("--skip-rabbitmq", action="store_true")
    p.add_argument("--skip-ours", action="store_true")
    p.add_argument("--load-arg", action="append", default=[], metavar="ARG",
                   help="extra amqp_load.py argument, repeatable (e.g. "
                        "--load-arg=--rate --load-arg=20000, or --load-arg=--verify)")
    p.add_argument("--json", action="store_true",
                   help="also print one JSON line with all results")
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    args = build_parser().parse_args(argv)

    if args.scenario == "all":
        scenarios = list(SCENARIOS)
    else:
        scenarios = [s.strip() for s in args.scenario.split(",") if s.strip()]
        bad = [s for s in scenarios if s not in SCENARIOS]
        if bad or not scenarios:
            print(f"unknown scenario(s) {bad}; choose from {', '.join(SCENARIOS)} or all",
                  file=sys.stderr)
            return 2

    # turn SIGTERM into a normal exit so the finally-blocks kill the broker
    def _on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _on_term)

    tmpdir = tempfile.mkdtemp(prefix="exchange-broker-bench-")
    log_path = args.broker_log or os.path.join(tmpdir, "broker.log")
    host = "127.0.0.1"
    ours: dict[str, dict] = {}
    rabbit: dict[str, dict] | None = None
    ours_name = "exchange-broker"
    broker: Broker | None = None
    rc = 0
    try:
        if not args.skip_ours:
            port = free_port(host)
            subst = {"host": host, "port": str(port), "tmpdir": tmpdir}
            base = shlex.split(args.broker_cmd) if args.broker_cmd else default_broker_cmd()
            template = any("{port}" in part for part in base)
            base = [part.format(**subst) for part in base]
            extra = list(args.broker_arg) + passthrough
            store_given = any(a.split("=", 1)[0] in STORE_FLAGS for a in extra)
            if not args.no_temp_data_dir and not store_given and not template:
                # never touch the user's default store (~/.local/share/...)
                os.makedirs(os.path.join(tmpdir, "data"), exist_ok=True)
                extra += ["--data-dir", "{tmpdir}/data"]
            extra = [a.format(**subst) for a in extra]
            use_admin = not args.no_admin_port and not template
            for attempt in (1, 2):
                cmd = list(base)
                if not template:
                    cmd += ["--host", host, "--port", str(port)]
                    if use_admin:
                        cmd += ["--admin-port", "0"]
                cmd += extra
                print(f"starting broker: {shlex.join(cmd)}", file=sys.stderr, flush=True)
                broker = Broker(cmd, host, port, log_path, tmpdir)
                try:
                    broker.start(args.startup_timeout)
                    break
                except BrokerFailed:
                    log = tail(log_path)
                    broker.stop()
                    broker = None
                    if attempt == 1 and use_admin and "admin-port" in log:
                        print("broker rejected --admin-port; retrying without it",
                              file=sys.stderr)
                        use_admin = False
                        continue
                    raise
            ours = bench_target("ours", host, port, scenarios, args, args.load_arg)
            if any("error" in r for r in ours.values()):
                print(f"--- broker log tail ({log_path}) ---\n{tail(log_path)}",
                      file=sys.stderr)
            for r in ours.values():
                if r.get("server") and "RabbitMQ" not in r["server"]:
                    ours_name = r["server"]
                    break
            if broker.proc is not None and broker.proc.poll() is not None:
                print(f"warning: broker exited with code {broker.proc.returncode} "
                      f"during the benchmark", file=sys.stderr)
            broker.stop()
            broker = None

        if args.skip_rabbitmq:
            print("RabbitMQ: skipped (--skip-rabbitmq)", file=sys.stderr)
        elif not port_open(args.rabbit_host, args.rabbit_port, 1.0):
            print(f"RabbitMQ: not reachable at {args.rabbit_host}:{args.rabbit_port}, "
                  f"skipped", file=sys.stderr)
        else:
            rargs = argparse.Namespace(**vars(args))
            rargs.user = args.rabbit_user or args.user
            rargs.password = args.rabbit_password or args.password
            rabbit = bench_target("rabbitmq", args.rabbit_host, args.rabbit_port,
                                  scenarios, rargs, args.load_arg)

        print()
        print_table(scenarios, ours, rabbit, ours_name)
        if args.json:
            print(json.dumps({"ours": ours, "rabbitmq": rabbit}, separators=(",", ":")))
        for r in list(ours.values()) + list((rabbit or {}).values()):
            if "error" in r or r.get("verify_ok") is False:
                rc = 1
    except BrokerFailed as exc:
        print(f"error: {exc}\n--- broker log ({log_path}) ---\n{tail(log_path)}",
              file=sys.stderr)
        rc = 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        rc = 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # don't interrupt cleanup
        if broker is not None:
            if rc not in (0, 130):
                print(f"--- broker log tail ---\n{tail(log_path)}", file=sys.stderr)
            broker.stop()
        shutil.rmtree(tmpdir, ignore_errors=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return rc


if __name__ == "__main__":
    sys.exit(main())
