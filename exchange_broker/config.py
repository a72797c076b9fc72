"""Every setting of ``exchange-broker serve`` (and the store settings ``db`` uses), once.

:class:`Config` holds each setting with its default; the command line's ``serve`` (and ``db``)
options are generated from its fields (:func:`add_arguments`), so a setting, its flag
(``--frame-max``), its environment variable (``EXCHANGE_BROKER_FRAME_MAX``) and its help text are
declared in one place. The CLI builds one Config and hands it to the application, which passes
the parts each component needs (limits to sessions, TLS to the listener, ...) down.

A Config validates itself when it is made (a ``ValueError`` whose message names the flag) and
derives what the components need: :attr:`Config.limits` (what ``connection.tune`` offers),
:attr:`Config.store_url`, :attr:`Config.tls`.
"""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping

from exchange_broker.mqtt.vhost_choice import parse_port_mapping
from exchange_broker.protocol.constants import (CHANNEL_MAX_DEFAULT, FRAME_MAX_DEFAULT, FRAME_MIN_SIZE,
                                                HEARTBEAT_DEFAULT, MAX_MESSAGE_SIZE_DEFAULT)
from exchange_broker.server.resources import parse_size
from exchange_broker.server.tls import DEFAULT_TLS_PORT, TLSConfig

ENV_PREFIX = "EXCHANGE_BROKER_"
TRUE_WORDS = ("1", "true", "yes")  # what a boolean environment variable must say to mean "on"
DEFAULT_DATA_DIR = os.path.join("~", ".local", "share", "exchange-broker")
SERVE, DB, CLUSTER = "serve", "db", "cluster"


def setting(default: Any, help: str, *, group: str, type: Callable | None = None,
            choices: tuple | None = None, commands: tuple[str, ...] = (SERVE,),
            default_text: str | None = None) -> Any:
    """A Config field: its default plus what the command line needs to offer it.

    The flag is ``--<name-with-dashes>``; the environment variable ``EXCHANGE_BROKER_<NAME>``;
    ``type`` defaults to the default's type (``str`` when it is None); a ``bool`` is a switch."""
    kind = type or (str if default is None else default.__class__)
    return field(default=default, metadata={
        "help": help, "group": group, "type": kind, "choices": choices, "commands": commands,
        "default_text": default_text})


@dataclass
class Config:
    # -- listeners --------------------------------------------------------------------------------
    host: str = setting("::", "listen address (:: is every IPv6 and IPv4 address, as RabbitMQ's default "
                        "listener; 0.0.0.0 IPv4 only)", group="listeners")
    port: int = setting(5672, "AMQP port (0 picks a free port)", group="listeners")
    port_file: str | None = setting(
        None, "write the bound AMQP port to this file once listening (for tests/scripts)",
        group="listeners", default_text="none")
    handshake_timeout: float = setting(
        10.0, "seconds a socket may take to finish the TLS and AMQP handshakes", group="listeners")
    scheduler_busy_wait: int = setting(
        100, "microseconds the event loop keeps polling after AMQP input before it sleeps: a "
        "message arriving meanwhile is read without a wake-up (lower latency, a little CPU; as "
        "Erlang's scheduler busy wait, +sbwt, which RabbitMQ runs with); 0 sleeps at once",
        group="listeners")
    # -- connection.tune and limits -----------------------------------------------------------------
    heartbeat: int = setting(HEARTBEAT_DEFAULT,
                             "heartbeat interval offered to clients in seconds (0 disables)", group="limits")
    frame_max: int = setting(FRAME_MAX_DEFAULT, "largest frame offered to clients, in bytes", group="limits")
    channel_max: int = setting(CHANNEL_MAX_DEFAULT, "channels offered to clients", group="limits")
    max_message_size: int = setting(MAX_MESSAGE_SIZE_DEFAULT,
                                    "larger publishes are refused with 406 PRECONDITION_FAILED", group="limits",
                                    default_text=f"{MAX_MESSAGE_SIZE_DEFAULT} (128 MiB)")
    max_connections: int = setting(0, "open AMQP connections allowed; more are refused with 530 (0: no limit)",
                                   group="limits")
    max_channels_per_connection: int = setting(
        0, "channels a connection may open (caps the channel_max offered; 0: --channel-max)", group="limits")
    consumer_timeout: int = setting(
        1_800_000, "ms a delivery may stay unacknowledged before its channel is closed (406); 0 disables",
        group="limits")
    # -- TLS ------------------------------------------------------------------------------------------
    tls_port: int = setting(DEFAULT_TLS_PORT, "amqps port, when --tls-cert and --tls-key are given "
                                              "(0 picks a free port)", group="TLS")
    tls_cert: str | None = setting(None, "server certificate (PEM; may hold the chain); turns on amqps and "
                                         "admin HTTPS", group="TLS", default_text="none")
    tls_key: str | None = setting(None, "private key (PEM)", group="TLS", default_text="none")
    tls_key_password: str | None = setting(None, "password of an encrypted private key", group="TLS",
                                           default_text="none")
    tls_ca: str | None = setting(None, "CA bundle (PEM) client certificates are verified against",
                                 group="TLS", default_text="none")
    tls_verify_peer: bool = setting(False, "verify client certificates (RabbitMQ's verify_peer); needs --tls-ca",
                                    group="TLS")
    tls_fail_if_no_peer_cert: bool = setting(
        False, "refuse clients that send no certificate (implies --tls-verify-peer)", group="TLS")
    no_admin_tls: bool = setting(False, "serve the admin API over plain HTTP even when TLS is configured",
                                 group="TLS")
    # -- MQTT (RabbitMQ's mqtt.listeners.tcp, mqtt.max_packet_size_authenticated, mqtt.vhost) ------
    mqtt_port: int | None = setting(None, "MQTT 3.1/3.1.1/5.0 port (RabbitMQ's mqtt.listeners.tcp; off unless "
                                          "given; 0 picks a free port)", group="MQTT", type=int,
                                    default_text="off")
    mqtt_ws_port: int | None = setting(None, "MQTT over WebSocket port, path /ws (RabbitMQ's web_mqtt.tcp.port; "
                                             "off unless given)", group="MQTT", type=int, default_text="off")
    mqtts_port: int | None = setting(None, "MQTT over TLS port with the --tls-cert/--tls-key files (RabbitMQ's "
                                           "mqtt.listeners.ssl; off unless given)", group="MQTT", type=int,
                                     default_text="off")
    mqtt_max_packet_size: int = setting(268_435_455, "larger MQTT packets close the connection "
                                        "(RabbitMQ's mqtt.max_packet_size_authenticated)", group="MQTT")
    mqtt_vhost: str = setting("/", "vhost of MQTT users who do not name one as 'vhost:user' "
                                   "(RabbitMQ's mqtt.vhost)", group="MQTT")
    mqtt_port_to_vhost_mapping: str | None = setting(
        None, "vhost of each MQTT listener port for users who do not name one, as JSON: "
              "'{\"1883\": \"vhost1\", \"8883\": \"vhost2\"}' (RabbitMQ's mqtt_port_to_vhost_mapping "
              "global parameter)", group="MQTT", default_text="none")
    mqtt_ignore_colons_in_username: bool = setting(
        False, "a colon in an MQTT user name is part of the name, not 'vhost:user' "
               "(RabbitMQ's mqtt.ignore_colons_in_username)", group="MQTT")
    # -- store ------------------------------------------------------------------------------------------
    data_dir: str = setting(DEFAULT_DATA_DIR, "directory of the embedded SQLite store", group="store",
                            commands=(SERVE, DB))
    database_url: str | None = setting(
        None, "PostgreSQL or SQLite URL, e.g. postgresql://user@host/db (psycopg 3); overrides --data-dir",
        group="store",
        commands=(SERVE, DB, CLUSTER), default_text="none")
    sqlite_synchronous: str = setting("FULL", "SQLite PRAGMA synchronous (FULL: every commit is fsynced)",
                                      group="store", choices=("FULL", "NORMAL", "OFF"), commands=(SERVE, DB))
    in_memory: bool = setting(False, "keep nothing on disk (no SQL store)", group="store")
    queue_window: int = setting(20000, "messages a durable queue keeps in memory before paging to the store",
                                group="store")
    stream_fsync: bool = setting(
        False, "fsync every commit of stream appends before confirming them (by default streams, like "
               "RabbitMQ's, are confirmed once written to the OS: a process crash loses nothing, a power "
               "loss may lose the last seconds)", group="store")
    no_publisher_pacing: bool = setting(
        False, "never pause reading a publisher because a queue with fast consumers falls behind it "
               "(flow control as RabbitMQ's credit flow; resource alarms and full consumer sockets "
               "still pause publishers)", group="limits")
    # -- resource alarms ----------------------------------------------------------------------------------
    memory_high_watermark: str = setting(
        "0.4", "block publishers above this resident memory: a fraction of RAM (0.4) or a size (512MiB); "
               "0 disables", group="resource alarms")
    disk_free_limit: str = setting(
        "50MB", "block publishers when the data directory's disk has less free space; 0 disables",
        group="resource alarms")
    # -- admin API and logging ------------------------------------------------------------------------
    admin_port: int = setting(15672, "admin HTTP API port (0 turns it off)", group="admin API")
    admin_host: str | None = setting(None, "admin HTTP API listen address", group="admin API",
                                     default_text="--host")
    stats_sample_interval: float = setting(
        5.0, "seconds between the admin API's statistics samples (rates, the UI's charts); "
             "10 minutes of samples are kept", group="admin API")
    cluster_name: str = setting("", "this broker's name (RabbitMQ's cluster_name): sent to clients, and what "
                                "federation (x-received-from) and shovels (x-shovelled) record",
                                group="listeners", default_text="exchange-broker@HOST:PORT")
    log_level: str = setting("INFO", "logging level (DEBUG, INFO, WARNING, ERROR)", group="logging",
                             commands=(SERVE, DB, CLUSTER))
    # -- start-up files and the default user (RabbitMQ's rabbitmq.conf, load_definitions) ---------------
    config: str | None = setting(
        None, "read settings from this file: TOML (*.toml, keys as these flags: frame_max = 131072) or "
              "RabbitMQ's rabbitmq.conf keys that map (listeners.tcp.default, default_user, heartbeat, "
              "load_definitions, ...); flags and variables win over the file", group="start-up",
        default_text="none")
    load_definitions: str | None = setting(
        None, "import this definitions file (JSON as the admin API exports; a directory: each *.json in "
              "it) at boot, before clients are accepted (RabbitMQ's load_definitions)", group="start-up",
        default_text="none")
    default_user: str = setting("guest", "the user created at boot, an administrator with all permissions "
                                         "on / (RabbitMQ's default_user)", group="start-up")
    default_pass: str = setting("guest", "its password (RabbitMQ's default_pass)", group="start-up")
    event_exchange: bool = setting(
        False, "publish the broker's events (queue.created, connection.closed, ...) to the exchange "
               "amq.rabbitmq.event of vhost / (RabbitMQ's rabbitmq_event_exchange plugin)", group="start-up")
    # -- cluster ----------------------------------------------------------------------------------------
    cluster: bool = setting(False, "join the cluster of the nodes on the same PostgreSQL --database-url "
                                   "(see --cluster-mode)", group="cluster")
    node_name: str | None = setting(None, "this node's name in the cluster (unique among the nodes)",
                                    group="cluster", default_text="host:port of the AMQP listener")
    cluster_mode: str = setting(
        "leaders", "how the nodes share the work: leaders (every node serves; each queue has a leader "
        "node, the one it was declared on, and the others forward to it; a dead node's queues are spread "
        "over the live ones) or active-standby (one node serves, the others pass their clients to it and "
        "one takes over when it dies)", group="cluster", choices=("leaders", "active-standby"))
    queue_leader_locator: str = setting(
        "client-local", "which node leads a durable queue declared in a cluster: client-local (the node the "
        "client declared it on) or balanced (the live node leading the fewest queues); a queue's "
        "x-queue-leader-locator argument overrides it", group="cluster", choices=("client-local", "balanced"))
    no_cluster_connection_handoff: bool = setting(
        False, "keep every client connection on the node it came in on, and forward message by message to "
               "the queues other nodes lead (the connection and its consumers outlive a leader: basic.cancel). "
               "By default a connection whose first publish (default exchange), basic.consume or basic.get "
               "names a queue another node leads is handed to that node, and this node passes its bytes "
               "through: the leader serves it as a local client, at a local client's cost, and the connection "
               "closes if that node goes (leaders mode)", group="cluster")
    cluster_heartbeat: float = setting(1.0, "seconds between a node's heartbeats (and lease renewals)",
                                       group="cluster")
    cluster_failover_timeout: float = setting(
        8.0, "seconds without a heartbeat after which a node is dead and its queues move", group="cluster")
    database_outage_nack_after: float = setting(
        0.0, "seconds a persistent publish may wait for its confirm from the database (while it is away or "
             "hung) before it is nacked with basic.nack; the message may still be stored and delivered if "
             "the write lands later (0: wait as long as it takes)", group="cluster")

    # -- authentication backends (RabbitMQ's auth_backends, auth_oauth2.*, auth_ldap.*) -------------
    auth_backends: str = setting(
        "internal", "the authentication backends, in the order they are asked (auth_backends.1 = ...): "
                    "internal, oauth2, ldap, comma-separated", group="auth")
    auth_timeout: float = setting(
        5.0, "seconds a backend may take to answer over the network (a JWKS fetch, an LDAP query) "
             "before the login is refused", group="auth")
    auth_oauth2_resource_server_id: str = setting(
        "rabbitmq", "auth_oauth2.resource_server_id: the prefix of the scopes this broker reads, and "
                    "the audience tokens must name", group="auth")
    auth_oauth2_jwks_url: str = setting("", "auth_oauth2.jwks_url: the issuer's JWKS document",
                                        group="auth")
    auth_oauth2_signing_key: str = setting(
        "", "auth_oauth2.signing_keys: PEM public keys, KID=FILE[,KID=FILE...] (a bare FILE is key "
            "id 'default')", group="auth")
    auth_oauth2_default_key: str = setting(
        "", "auth_oauth2.default_key: the key id used for tokens that name none", group="auth")
    auth_oauth2_issuer: str = setting("", "auth_oauth2.issuer: the iss claim tokens must carry "
                                          "(empty: not checked)", group="auth")
    auth_oauth2_audience: str = setting(
        "", "the aud claim tokens must carry (empty: the resource server id)", group="auth")
    auth_oauth2_verify_aud: str = setting("true", "auth_oauth2.verify_aud", group="auth",
                                          choices=("true", "false"))
    auth_oauth2_additional_scopes_key: str = setting(
        "", "auth_oauth2.additional_scopes_key (extra_scopes_source): claims (space-separated, "
            "dotted paths) whose values are scopes too", group="auth")
    auth_oauth2_preferred_username_claims: str = setting(
        "", "auth_oauth2.preferred_username_claims: comma-separated claims tried for the user name "
            "before sub and client_id", group="auth")
    auth_oauth2_scope_prefix: str | None = setting(
        None, "auth_oauth2.scope_prefix (default: the resource server id and a dot)", group="auth",
        default_text="RESOURCE_SERVER_ID.")
    management_oauth_client_id: str = setting(
        "", "management.oauth_client_id: the web UI's OAuth 2.0 client; set, the login page offers single "
            "sign-on (authorization code flow with PKCE) at --management-oauth-provider-url", group="auth")
    management_oauth_provider_url: str = setting(
        "", "management.oauth_provider_url: the identity provider (its /.well-known/openid-configuration "
            "names the authorization and token endpoints)", group="auth")
    management_oauth_scopes: str = setting(
        "openid profile", "management.oauth_scopes: the scopes the web UI asks for (add the broker's, e.g. "
                          "rabbitmq.tag:administrator, when the provider needs them asked)", group="auth")
    auth_ldap_servers: str = setting("", "auth_ldap.servers: LDAP server hosts, comma-separated, tried in "
                                         "order", group="auth")
    auth_ldap_port: int = setting(389, "auth_ldap.port", group="auth")
    auth_ldap_use_ssl: bool = setting(False, "auth_ldap.use_ssl: LDAPS", group="auth")
    auth_ldap_use_starttls: bool = setting(False, "auth_ldap.use_starttls", group="auth")
    auth_ldap_ssl_ca_file: str = setting("", "auth_ldap.ssl_options.cacertfile: the CA that signed the "
                                             "server's certificate (default: the system's)", group="auth")
    auth_ldap_user_dn_pattern: str = setting("${username}", "auth_ldap.user_dn_pattern", group="auth")
    auth_ldap_dn_lookup_attribute: str = setting(
        "", "auth_ldap.dn_lookup_attribute: find the user's DN by this attribute (e.g. uid)", group="auth")
    auth_ldap_dn_lookup_base: str = setting("", "auth_ldap.dn_lookup_base", group="auth")
    auth_ldap_group_lookup_base: str = setting(
        "", "auth_ldap.group_lookup_base: where in_group_nested (and in_group on a DN naming the vhost "
            "or resource) look for the user's groups (default: --auth-ldap-dn-lookup-base)", group="auth")
    auth_ldap_vhost_access_query: str = setting(
        '["constant", true]', "auth_ldap.vhost_access_query, in JSON (README: LDAP)", group="auth")
    auth_ldap_resource_access_query: str = setting(
        '["constant", true]', "auth_ldap.resource_access_query, in JSON", group="auth")
    auth_ldap_topic_access_query: str = setting(
        '["constant", true]', "auth_ldap.topic_access_query, in JSON", group="auth")
    auth_ldap_tag_queries: str = setting(
        '{"administrator": ["constant", false]}', "auth_ldap.tag_queries, a JSON object tag -> query",
        group="auth")
    auth_ldap_pool_size: int = setting(64, "auth_ldap.pool_size: idle LDAP connections kept", group="auth")
    auth_ldap_timeout: float = setting(5.0, "auth_ldap.timeout: seconds for each LDAP operation",
                                       group="auth")

    def __post_init__(self) -> None:
        for name in ("port", "tls_port", "admin_port"):
            _check(self, name, 0, 65535, "a port number")
        for name in ("heartbeat", "channel_max"):  # AMQP short fields in connection.tune
            _check(self, name, 0, 65535, "a whole number")
        for name in ("max_message_size", "max_connections", "max_channels_per_connection",
                     "consumer_timeout", "queue_window", "handshake_timeout", "database_outage_nack_after"):
            _check(self, name, 0, None, "a number")
        for name in ("mqtt_port", "mqtt_ws_port", "mqtts_port"):
            if getattr(self, name) is not None:
                _check(self, name, 0, 65535, "a port number")
        if self.mqtts_port is not None and not (self.tls_cert and self.tls_key):
            raise ValueError("--mqtts-port needs --tls-cert and --tls-key")
        _check(self, "mqtt_max_packet_size", 2, 268_435_455, "a packet size")
        try:
            parse_port_mapping(self.mqtt_port_to_vhost_mapping)
        except ValueError as err:
            raise ValueError(f"--mqtt-port-to-vhost-mapping {err}") from None
        _check(self, "frame_max", FRAME_MIN_SIZE, 2 ** 32 - 1, "a frame size")
        _check(self, "stats_sample_interval", 0.1, 3600, "a number of seconds")
        for f in fields(self):
            choices = f.metadata["choices"]
            if choices and getattr(self, f.name) not in choices:
                raise ValueError(f"{flag_of(f.name)} must be one of {', '.join(choices)}, "
                                 f"not {getattr(self, f.name)!r}")
        for name in ("memory_high_watermark", "disk_free_limit"):
            try:
                parse_size(getattr(self, name), relative_to=1)
            except ValueError:
                raise ValueError(f"{flag_of(name)} must be a fraction (0.4) or a size (512MiB, 50MB), "
                                 f"not {getattr(self, name)!r}") from None
        _check(self, "cluster_heartbeat", 0.05, 60, "a number of seconds")
        _check(self, "scheduler_busy_wait", 0, 100_000, "a number of microseconds")
        _check(self, "cluster_failover_timeout", 0.1, 3600, "a number of seconds")
        if self.cluster_failover_timeout <= self.cluster_heartbeat:
            raise ValueError("--cluster-failover-timeout must be longer than --cluster-heartbeat")
        self.tls  # noqa: B018 - TLS needs a certificate and a key; verify-peer needs a CA
        if self.database_url:
            self.database_url = normalize_database_url(self.database_url)
        if self.cluster and (self.in_memory or not (self.database_url or "").startswith("postgresql")):
            raise ValueError("--cluster needs a PostgreSQL --database-url (the nodes share it; "
                             "SQLite and --in-memory stores are single-node)")
        bad = [b for b in self.auth_backend_list if b not in ("internal", "oauth2", "ldap")]
        if bad or not self.auth_backend_list:
            raise ValueError(f"--auth-backends must list internal, oauth2 or ldap, not {self.auth_backends!r}")
        _check(self, "auth_timeout", 0.1, 120, "a number of seconds")
        if self.node_name is not None and not self.node_name.strip():
            raise ValueError("--node-name must not be empty")

    # -- derived ------------------------------------------------------------------------------------
    @property
    def limits(self) -> dict:
        """What each connection offers in connection.tune, the largest message it accepts and,
        with --no-publisher-pacing, ``publisher_pacing: False`` (queue_types/pacing.py)."""
        channel_max = self.channel_max
        per_conn = self.max_channels_per_connection  # caps the channel_max offered
        if per_conn and (not channel_max or per_conn < channel_max):
            channel_max = per_conn
        limits = {"heartbeat": self.heartbeat, "frame_max": self.frame_max, "channel_max": channel_max,
                  "max_message_size": self.max_message_size}
        if self.no_publisher_pacing:
            limits["publisher_pacing"] = False
        return limits

    @property
    def auth_backend_list(self) -> list[str]:
        return [b.strip() for b in self.auth_backends.split(",") if b.strip()]

    @property
    def data_path(self) -> str:
        """The data directory, absolute."""
        return os.path.abspath(os.path.expanduser(self.data_dir))

    @property
    def store_url(self) -> str:
        """The SQLAlchemy URL of the store: --database-url, else broker.db in the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{os.path.join(self.data_path, 'broker.db')}"

    @property
    def disk_watch_dir(self) -> str | None:
        """The directory whose free space the disk alarm watches (None: nothing on a local disk)."""
        return None if self.in_memory or self.database_url else self.data_path

    @property
    def cluster_node_name(self) -> str:
        """--node-name, else ``host:port`` of the AMQP listener (the host's name for a wildcard
        address; with --port 0 the port is not known yet: the process id stands in for it)."""
        if self.node_name:
            return self.node_name.strip()
        host = self.host if self.host not in ("0.0.0.0", "::", "") else socket.gethostname()
        return f"{host}:{self.port}" if self.port else f"{host}:pid{os.getpid()}"

    @property
    def admin_listen_host(self) -> str:
        return self.admin_host or self.host

    @property
    def tls(self) -> TLSConfig | None:
        """The amqps listener's settings (None: no certificate, no TLS)."""
        cert, key = self.tls_cert, self.tls_key
        if not cert and not key:
            return None
        if not (cert and key):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        return TLSConfig(cert, key, self.tls_ca, bool(self.tls_verify_peer), bool(self.tls_fail_if_no_peer_cert),
                         self.tls_key_password, self.tls_port)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> "Config":
        """The Config of parsed ``serve`` (or ``db``) options; settings a command lacks keep their default."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def normalize_database_url(url: str) -> str:
    """``url`` checked and made explicit (``persistence/database_url.py``: libpq's URLs, multi-host
    included, always through psycopg 3; SQLite through the sqlite3 module). A ValueError (one line,
    never the password) for anything else."""
    from persistence.database_url import parse
    return parse(url).url


def _check(config: Config, name: str, low: float, high: float | None, what: str) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or \
            (high is not None and value > high):
        bound = f"{low}-{high}" if high is not None else f">= {low}"
        raise ValueError(f"{flag_of(name)} must be {what} ({bound}), not {value!r}")


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_of(name: str) -> str:
    return ENV_PREFIX + name.upper()


# -- the command line, generated from the fields ------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser, command: str = SERVE,
                  environ: Mapping[str, str] | None = None) -> None:
    """Add the options of ``command`` ("serve" or "db") to ``parser``, one per Config field.

    An option's default is its environment variable when that is set (checked and converted like
    the option itself), else the field's default."""
    environ = os.environ if environ is None else environ
    groups: dict[str, Any] = {}
    for f in fields(Config):
        meta = f.metadata
        if command not in meta["commands"]:
            continue
        group = groups.get(meta["group"])
        if group is None:
            group = groups[meta["group"]] = parser.add_argument_group(meta["group"])
        env = env_of(f.name)
        raw = environ.get(env)
        shown = meta["default_text"] or ({True: "on", False: "off"}.get(f.default, f.default)
                                         if isinstance(f.default, bool) else f.default)
        help_text = f"{meta['help']} [env {env}, default {shown}]".replace("%", "%%")
        if meta["type"] is bool:
            default = f.default if raw is None else raw in TRUE_WORDS
            group.add_argument(flag_of(f.name), action="store_true", default=default, help=help_text)
        else:
            # a string default (the environment's) is converted by argparse with ``type``
            group.add_argument(flag_of(f.name), type=meta["type"], choices=meta["choices"],
                               default=f.default if raw is None else raw, help=help_text)
