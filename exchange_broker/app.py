"""The application: a :class:`~exchange_broker.config.Config` in, a running broker out.

:class:`Application` owns the lifecycle in one place (as uvicorn's ``Server`` does): ``start()``
builds the store and its durability, the broker (on this loop's clock), recovers the stored
state, opens the AMQP/AMQPS listeners, the admin API and the resource monitor; ``serve()`` runs
until SIGTERM/SIGINT; ``stop()`` shuts down gracefully (admin API, listeners with
connection.close 320, delayed exchange, durability, store).

The assembly functions (:func:`build_broker`, :func:`recover`, :func:`make_server`) are the one
way to put a broker together; ``testing.ThreadedBroker`` uses them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import socket
import sys
import tempfile

from exchange_broker.assembly import make_broker
from exchange_broker.config import Config
from exchange_broker.core.broker import Broker
from exchange_broker.core.clock import Clock
from exchange_broker.server.clock import LoopClock
from exchange_broker.server.listener import BrokerServer, install_signal_handlers, socket_error_text
from exchange_broker.server.resources import ResourceMonitor, parse_size, total_memory

log = logging.getLogger("exchange_broker")

LOCK_CHECK_INTERVAL = 5.0  # seconds between checks that the store's lock is still held
GC_THRESHOLDS = (20_000, 10, 10)  # gc.set_threshold once started (defaults: 700, 10, 10)


def limits_from(config: Config) -> dict:
    """What each connection offers in connection.tune (:attr:`Config.limits`)."""
    return config.limits


class StartupError(Exception):
    """The broker cannot start for a reason the message explains in one line (no traceback)."""


def prepare_data_dir(path: str) -> None:
    """Create the data directory if needed and make sure the broker can write there."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise StartupError(f"the data directory {path} is not a directory") from None
    except OSError as exc:
        raise StartupError(f"cannot create the data directory {path}: {exc.strerror}") from None
    if not os.path.isdir(path):
        raise StartupError(f"the data directory {path} is not a directory")
    try:  # os.access says yes to root even where the file system says no
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StartupError(f"the data directory {path} is not writable: {exc.strerror}") from None


def database_url(config: Config) -> str:
    """The store's URL; the data directory is created when the store lives there."""
    if not config.database_url:
        prepare_data_dir(config.data_path)
    return config.store_url


def _one_line(exc: BaseException) -> str:
    """An exception as one line, without an OSError's '[Errno N]' prefix."""
    exc = getattr(exc, "orig", None) or exc
    text = str(exc)
    if isinstance(exc, OSError) and exc.errno and isinstance(exc.strerror, str):
        text = exc.strerror + (f": {exc.filename}" if exc.filename else "")
    return " ".join(text.split()) or type(exc).__name__


def open_store(config: Config, held_lock=None):
    """Lock the store (one broker per store), then open it, applying the alembic migrations
    (blocking: run it off the loop). Returns ``(store, lock)``; the caller releases the lock
    after closing the store. ``held_lock``: the store's lock, already taken (a cluster node)."""
    from sqlalchemy.exc import SQLAlchemyError

    from persistence.database_url import hide_password
    from persistence.lock import StoreInUse, store_lock
    from persistence.sql_store import SqlStore
    url = database_url(config)
    where = hide_password(url)
    store = SqlStore(url, sqlite_synchronous=config.sqlite_synchronous)
    lock = held_lock or store_lock(url)
    try:
        if lock is not None and held_lock is None:
            lock.acquire()
        store.open()
    except StoreInUse as exc:
        raise StartupError(str(exc)) from None
    except (SQLAlchemyError, OSError) as exc:  # an unwritable SQLite file, a database server that is down
        store.close()
        if lock is not None:
            lock.release()
        raise StartupError(f"cannot open the store {where}: {_one_line(exc)}") from exc
    log.info("store: %s (schema revision %s)", where, store.schema_revision or "none")
    return store, lock


def build_broker(clock: Clock, *, durability=None, config: Config | None = None) -> Broker:
    """The broker with the standard queue types, its clock and durability, and the settings of
    ``config`` (the defaults without one)."""
    config = config or Config()
    broker = make_broker(clock=clock, durability=durability, consumer_timeout_ms=config.consumer_timeout,
                         max_connections=config.max_connections, default_user=config.default_user,
                         default_pass=config.default_pass)
    broker.confirm_nack_after = config.database_outage_nack_after
    if config.auth_backend_list != ["internal"]:  # --auth-backends (exchange_broker/auth/)
        from exchange_broker.auth.chain import make_chain
        try:
            broker.auth = make_chain(broker, config, getattr(clock, "loop", None))
        except ValueError as exc:
            raise StartupError(str(exc)) from None
    if config.event_exchange:  # before recovery: durable queues bound to it get their bindings back
        from exchange_broker.core.events import EventExchange
        broker.events = EventExchange(broker)
        broker.events.install()
    return broker


def recover(broker: Broker, durability, window: int) -> None:
    """Restore the stored state into ``broker`` and start writing. Recovery may expire and
    dead-letter messages whose TTL passed while the broker was down: that outcome is stored, and
    TTL / x-expires timers are armed on the broker's clock."""
    from exchange_broker.durability.recovery import restore
    restore(broker, durability, window)
    durability.start()
    broker.delayed.recover()  # pending delayed messages: ids, the first window, overdue ones


def make_monitor(broker: Broker, config: Config) -> ResourceMonitor:
    """The memory and disk alarms of ``config``."""
    memory = parse_size(config.memory_high_watermark, relative_to=total_memory())
    return ResourceMonitor(broker, memory, config.disk_watch_dir, parse_size(config.disk_free_limit))


def make_server(broker: Broker, config: Config) -> BrokerServer:
    """The AMQP (and, with a certificate, AMQPS) listeners of ``config``; not started."""
    return BrokerServer(broker, config.host, config.port, limits=config.limits,
                        handshake_timeout=config.handshake_timeout, tls=config.tls,
                        monitor=make_monitor(broker, config),
                        busy_wait_us=config.scheduler_busy_wait)


async def start_admin(config: Config, broker: Broker, server: BrokerServer):
    """The admin HTTP API in this loop (``--admin-port 0`` turns it off). A port that cannot be
    bound stops the start-up (StartupError): a broker without the API it was asked for is not
    what the operator started."""
    if not config.admin_port:
        return None
    from exchange_broker.management.server import AdminServer
    host, port = config.admin_listen_host, config.admin_port
    # HTTPS with the amqps certificate unless --no-admin-tls
    ssl_options = server.tls.uvicorn_options() if server.tls is not None and not config.no_admin_tls else None
    admin = AdminServer(broker, host, port, amqp_server=server, ssl_options=ssl_options,
                        sample_interval=config.stats_sample_interval, trust_local_proxy=config.cluster)
    if config.management_oauth_client_id:  # the web UI's single sign-on (GET /api/auth)
        admin.context.ui_oauth = {"oauth_enabled": True, "oauth_client_id": config.management_oauth_client_id,
                                  "oauth_provider_url": config.management_oauth_provider_url,
                                  "oauth_scopes": config.management_oauth_scopes}
    try:
        await admin.start()
    except OSError as exc:
        why = socket_error_text(exc)
        raise StartupError(f"cannot listen on {host}:{port} for the admin API: {why}") from exc
    return admin


async def start_mqtt(config: Config, broker: Broker, durability) -> list:
    """The MQTT listeners of ``--mqtt-port``, ``--mqtt-ws-port`` and ``--mqtts-port`` (none
    without them), sharing one hub; retained messages are kept in the store when there is one."""
    ports = (config.mqtt_port, config.mqtt_ws_port, config.mqtts_port)
    if all(port is None for port in ports):
        return []
    from exchange_broker.mqtt.hub import MQTTHub, MQTTSettings
    from exchange_broker.mqtt.retained import RetainedStore
    from exchange_broker.server.mqtt_listener import MQTTServer
    from exchange_broker.server.mqtt_websocket import MQTTWebSocketProtocol
    from exchange_broker.mqtt.vhost_choice import parse_port_mapping
    settings = MQTTSettings(max_packet_size=config.mqtt_max_packet_size, vhost=config.mqtt_vhost,
                            port_vhosts=parse_port_mapping(config.mqtt_port_to_vhost_mapping),
                            ignore_colons_in_username=config.mqtt_ignore_colons_in_username)
    retained = RetainedStore()
    if durability is not None:
        from exchange_broker.durability.retained_writes import RetainedWrites, stored_retained
        rows = await asyncio.get_running_loop().run_in_executor(None, stored_retained, durability.store)
        retained.load(rows)
        retained.persist = RetainedWrites(durability)
    hub = MQTTHub(broker, settings, retained)
    servers = []
    if config.mqtt_port is not None:
        servers.append(MQTTServer(hub, config.host, config.mqtt_port))
    if config.mqtt_ws_port is not None:
        servers.append(MQTTServer(hub, config.host, config.mqtt_ws_port, what="MQTT over WebSocket",
                                  protocol=MQTTWebSocketProtocol))
    if config.mqtts_port is not None:
        servers.append(MQTTServer(hub, config.host, config.mqtts_port, ssl=config.tls.server_context(),
                                  what="MQTTS"))
    for server in servers:
        try:
            await server.start()
        except OSError as exc:
            raise StartupError(str(exc)) from exc
        except ValueError as exc:  # TLS files that cannot be loaded
            raise StartupError(str(exc)) from exc
    return servers


def advertised(host: str) -> str:
    """The address other nodes and the operator reach a listener on: the host's name for a
    wildcard address."""
    return socket.gethostname() if host in ("0.0.0.0", "::", "") else host


class Application:
    """One broker process: ``await Application(config).serve()`` until SIGTERM/SIGINT."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.store = None
        self.store_lock = None  # persistence.lock.StoreLock: one broker per store
        self._lock_watch: asyncio.Task | None = None
        self.durability = None
        self.broker: Broker | None = None
        self.server: BrokerServer | None = None
        self.mqtt: list = []  # server/mqtt_listener.MQTTServer for each MQTT listener
        self.admin = None
        self.should_exit = asyncio.Event()
        self._stopped = False
        self.cluster = None  # exchange_broker.cluster.node.ClusterNode with --cluster
        self.movers = None  # exchange_broker.movers.parameters.Parameters: shovels
        self.forwarders: list = []  # a cluster standby's listeners, passing clients to the active node
        self.exit_code = 0

    async def start(self) -> bool:
        """Build and start everything; False when asked to exit before serving (a cluster standby)."""
        config = self.config
        loop = asyncio.get_running_loop()
        held_lock = None
        if config.cluster and config.cluster_mode == "leaders":
            from exchange_broker.cluster.node import ClusterStartError
            try:
                await self._start_leaders(loop)
            except ClusterStartError as exc:
                raise StartupError(str(exc)) from None
            config = self.config
        elif config.cluster:
            held_lock = await self._join_cluster()
            if held_lock is None:
                return False
            config = self.config  # with its bound ports and this node's database session name
        if self.broker is None and not config.in_memory:
            from exchange_broker.durability.sql import SqlDurability
            self.store, self.store_lock = await loop.run_in_executor(None, open_store, config, held_lock)
            if self.cluster is not None and not await self.cluster.become_active(self.store, self.should_exit):
                return False
            await self._stop_forwarding()  # this node serves now, on the same ports
            config = self.config
            if self.store_lock is not None and self.cluster is None:  # a cluster node checks it each beat
                self._lock_watch = loop.create_task(self._watch_lock(), name="store-lock")
            self.durability = SqlDurability(self.store, loop, window=config.queue_window,
                                            fsync_streams=config.stream_fsync)
        if self.broker is None:
            self.broker = await self._warm_broker() or \
                build_broker(LoopClock(loop), durability=self.durability, config=config)
            if self.durability is not None:
                recover(self.broker, self.durability, config.queue_window)
        gc.collect()
        gc.freeze()  # start-up objects are never scanned again: full GC pauses drop from ~250 to ~60 ms
        # a young collection every GC_YOUNG net new objects, not every 700: a burst of publishes
        # allocates messages that mostly live until their commit, so at 700 the collector ran
        # ~9,000 times per million stream appends and took ~18% of the broker's CPU
        gc.set_threshold(*GC_THRESHOLDS)
        if config.load_definitions:  # before the listeners accept anyone (RabbitMQ's load_definitions)
            from exchange_broker.management.boot_definitions import load_definitions
            try:
                load_definitions(self.broker, config.load_definitions)
            except ValueError as exc:
                raise StartupError(str(exc)) from None
        self.server = make_server(self.broker, config)
        if self.cluster is not None:
            await self.cluster.renew()  # recovery took a while: the lease runs from now again
            self.server.guard = self.cluster.guard
            self.cluster.server = self.server
            if config.cluster_mode != "leaders":  # active/standby: its durable queues wait past the lease
                self.broker.delivery_guard = self.cluster.guard
        await self.server.start()
        from exchange_broker.movers.start import start_movers
        self.movers = await start_movers(self.broker, self.store, config.host, self.server.port,
                                          config.cluster_name, self.cluster if config.cluster_mode == "leaders"
                                          and config.cluster else None)
        self.mqtt = await start_mqtt(config, self.broker, self.durability)
        self.server.other_listeners += [m.listing for m in self.mqtt]
        self.admin = await start_admin(config, self.broker, self.server)
        if self.admin is not None:
            self.admin.context.movers = self.movers  # shovels and runtime parameters
        if config.port_file and (not config.cluster or config.cluster_mode == "leaders"):
            # an active/standby node wrote it when it began to listen
            with open(config.port_file, "w") as fh:
                fh.write(str(self.server.port))
        if self.cluster is not None:
            if self.admin is not None:
                self.admin.context.cluster = self.cluster  # /api/nodes lists every node
            admin = f"{advertised(config.admin_listen_host)}:{self.admin.port}" if self.admin is not None else ""
            await self.cluster.serving(self.broker, f"{advertised(config.host)}:{self.server.port}",
                                       admin)
        log.info("exchange-broker ready on %s:%d", f"[{config.host}]" if ":" in config.host else config.host,
                 self.server.port)
        return True

    async def _start_leaders(self, loop) -> None:
        """A node of a cluster with per-queue leaders, assembled here in the order
        ``cluster/serve_leaders.py`` gives: node, shared store, join, durability and broker as for
        one node, then the node plugged into them. The caller listens, then ``cluster.serving``."""
        from exchange_broker.cluster import serve_leaders as leaders
        from exchange_broker.durability.sql import SqlDurability
        config = self.config = leaders.node_config(self.config)
        node = self.cluster = leaders.make_node(config, advertised)
        self.store = await leaders.open_store(config)
        await leaders.join(node, self.store)
        self.durability = SqlDurability(self.store, loop, window=config.queue_window, fsync_streams=config.stream_fsync)
        self.broker = build_broker(LoopClock(loop), durability=self.durability, config=config)
        await leaders.plug_in(node, self.store, self.broker, self.durability, config)

    async def _join_cluster(self):
        """Join as a standby until the store's lock is ours (returned), None when asked to exit."""
        from exchange_broker.cluster.node import ClusterNode, ClusterStartError
        from persistence.lock import store_lock
        await self._start_forwarding()  # first: with --port 0 the node's default name needs the port
        from persistence.cluster_store import tagged_url
        # every database session of this process is named after its pid and host: a node whose
        # lease ran out while it held the store (paused, hung) has them ended by the next one
        config = self.config = dataclasses.replace(self.config, database_url=tagged_url(self.config.store_url))
        self.cluster = ClusterNode(config.store_url, config.cluster_node_name, config.cluster_heartbeat,
                                   config.cluster_failover_timeout)
        self.cluster.on_lost = self._lost_cluster_role
        admin = f"{advertised(config.admin_listen_host)}:{config.admin_port}" if config.admin_port else ""
        self.cluster.listening = (f"{advertised(config.host)}:{config.port}", admin)
        self.cluster.make_mirror = self._standby_mirror
        lock = store_lock(config.store_url)
        try:
            return lock if await self.cluster.acquire_store(lock, self.should_exit) else None
        except ClusterStartError as exc:
            raise StartupError(str(exc)) from None

    async def _start_forwarding(self) -> None:
        """A cluster node listens at once: while it stands by, its AMQP and admin listeners pass
        every client to the active node (exchange_broker.cluster.forward, standby_admin). The
        ports they bound are the ones the node serves on once active (``--port 0`` included)."""
        from exchange_broker.cluster.forward import ConnectionSplicer
        from exchange_broker.cluster.standby_admin import StandbyAdminApp
        from exchange_broker.management.server import AdminServer
        config = self.config
        # a standby passes IPv4 clients on (the dual-stack default is the serving listener's)
        host = "0.0.0.0" if config.host == "::" else config.host
        amqp = ConnectionSplicer(host, config.port, lambda: self.cluster.amqp_target() if self.cluster else None)
        try:
            await amqp.start()
        except OSError as exc:
            raise StartupError(str(exc)) from None
        self.forwarders.append(amqp)
        admin_port = config.admin_port
        if config.admin_port:
            https = config.tls is not None and not config.no_admin_tls
            ssl_options = config.tls.uvicorn_options() if https else None
            admin = AdminServer(None, config.admin_listen_host, config.admin_port, ssl_options=ssl_options,
                                app=StandbyAdminApp(lambda: self.cluster.admin_target() if self.cluster else None,
                                                    https=https))
            try:
                await admin.start()
            except OSError as exc:
                raise StartupError(f"cannot listen on {config.admin_listen_host}:{config.admin_port} for the "
                                   f"admin API: {socket_error_text(exc)}") from exc
            self.forwarders.append(admin)
            admin_port = admin.port
        self.config = dataclasses.replace(config, port=amqp.port, admin_port=admin_port)
        if config.port_file:
            with open(config.port_file, "w") as fh:
                fh.write(str(amqp.port))

    async def _stop_forwarding(self) -> None:
        forwarders, self.forwarders = self.forwarders, []
        for forwarder in forwarders:
            await forwarder.stop()

    async def _warm_broker(self) -> Broker | None:
        """A standby that became active serves the broker it kept the definitions in (caught up
        with the store first); None otherwise."""
        warm = self.cluster.warm_broker if self.cluster is not None else None
        if warm is None or self.durability is None:
            return None
        from exchange_broker.cluster.definitions import load_rows, take_over
        self.cluster.warm_broker = None
        loop = asyncio.get_running_loop()
        rows = await loop.run_in_executor(None, load_rows, self.cluster.store, self.store)
        return warm if take_over(warm, rows, LoopClock(loop), self.durability) else None

    def _standby_mirror(self):
        """A standby's warm broker: the store's definitions, followed as they change (no listener,
        no admin API, no queue messages, no writes, no timers: a placeholder queue's x-expires
        must not fire on a node that does not serve it)."""
        from exchange_broker.cluster.definitions import DefinitionsMirror
        from exchange_broker.core.clock import NoClock
        from persistence.sql_store import SqlStore
        store = SqlStore(self.config.store_url)
        store.open(migrate_schema=False)
        broker = build_broker(NoClock(), config=self.config)
        return DefinitionsMirror(self.cluster.store, store, broker, owns_store=True)

    def _lost_cluster_role(self, why: str) -> None:
        """Fail-stop: a node that may no longer be the store's only writer ends at once, without
        another write (no flush, no graceful close: its clients reconnect to the next active node,
        and what it had not confirmed they publish again)."""
        logging.shutdown()
        os._exit(1)

    async def serve(self) -> int:
        # The group-commit writer thread needs the GIL back quickly after each database call; with
        # the default 5 ms switch interval a busy event loop delays every commit by up to 5 ms per
        # hand-off.
        sys.setswitchinterval(0.001)
        install_signal_handlers(self.should_exit)  # a cluster standby waits in start() for a long time
        try:
            serving = await self.start()
        except Exception as exc:
            await self._abandon_start()
            if isinstance(exc, StartupError):
                raise
            log.debug("start-up failed", exc_info=True)
            raise StartupError(_one_line(exc)) from exc
        except BaseException:
            await self._abandon_start()
            raise
        if serving:
            await self.should_exit.wait()
        log.info("shutting down")
        await self.stop()
        return self.exit_code

    async def stop(self) -> None:
        """Admin API, then listeners (connection.close 320 to every client), then the delayed
        exchange's last writes, the durability's writer and the store."""
        if self._stopped:
            return
        self._stopped = True
        await self._stop_forwarding()
        if self.admin is not None:
            await self.admin.stop()
        if self.movers is not None:
            await self.movers.close()
        for mqtt_server in self.mqtt:
            await mqtt_server.stop()
        if self.server is not None:
            await self.server.stop()
        if self.durability is not None:
            if self.broker is not None:
                self.broker.delayed.close()  # its last row deletes go to the writer before it stops
            await asyncio.get_running_loop().run_in_executor(None, self.durability.stop)
        if self._lock_watch is not None:
            self._lock_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lock_watch
        if self.cluster is not None:
            await self.cluster.stop()  # leave the cluster: its leases end, a standby may take over
        if self.store is not None:
            self.store.close()
        if self.cluster is not None and self.cluster.lock is not None and self.store_lock is None:
            self.cluster.lock.release()  # taken, but the store was never opened
        if self.store_lock is not None:
            self.store_lock.release()  # last: no other broker opens the store while we still write

    async def _watch_lock(self, interval: float = LOCK_CHECK_INTERVAL) -> None:
        """Now and then, make sure the store's lock is still ours (a PostgreSQL outage ends the
        session that holds it: it is taken again when the database is back)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            try:
                await loop.run_in_executor(None, self.store_lock.check)
            except Exception:
                log.exception("store lock check failed")

    async def _abandon_start(self) -> None:
        """A start that failed half-way: release what it opened (the caller reports the error)."""
        try:
            await self.stop()
        except Exception:
            log.debug("cleanup after a failed start", exc_info=True)
