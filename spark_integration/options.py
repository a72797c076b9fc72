"""Option parsing and validation for the ``amqp`` data source (pure Python, no JVM).

Every problem is reported as a ``ValueError`` naming the option, before any connection
is made, so a bad job fails at ``load()`` with a clear message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .amqp import ConnectionParams

QUEUE_TYPES = ("auto", "classic", "quorum", "stream")
STREAM_READS = ("auto", "chunks", "amqp")
ACK_MODES = ("peek", "onread")
DEDUPE_MODES = ("none", "messageid")

# lower-cased option name -> description (also the list of accepted options)
KNOWN_OPTIONS = {
    "url": "amqp[s]://user:pass@host:port/vhost (required)",
    "queue": "queue name (required)",
    "queuetype": "auto | classic | quorum | stream (default auto)",
    "adminurl": "HTTP base URL of the broker's management API, used by queueType=auto and "
                "to read stream ranges as stored chunks (streamRead)",
    "streamread": "stream queues: auto (default: the store's chunks through adminUrl when the "
                  "broker serves them, else AMQP) | chunks | amqp",
    "ackmode": "classic queues, batch: peek (default, nothing acked) | onRead",
    "maxmessages": "classic queues, batch: read at most this many messages",
    "numpartitions": "number of Spark partitions / parallel consumers (default 1)",
    "batchsize": "rows per Arrow record batch (default 10000)",
    "idletimeoutms": "classic queues: a consumer stops after this long without a delivery "
                     "(default 1000; streaming: 250)",
    "reconnecttimeoutms": "after a lost connection, how long the classic/quorum streaming source or a "
                          "stream range read keeps trying the url's nodes (a cluster failing over; "
                          "default 30000)",
    "maxmessagespertrigger": "classic/quorum queues, streaming: at most this many messages per "
                             "micro-batch (default 10000)",
    "dedupe": "classic/quorum queues, streaming: none (default) | messageId (exactly-once for "
              "publishers that set message_id; needs stateLocation)",
    "statelocation": "directory for the dedupe state (local path or a pyarrow filesystem URI "
                     "such as s3://bucket/path); one per query, kept with its checkpoint",
    "dedupewindowseconds": "how long a message_id is remembered (default 600)",
    "startingoffsets": "stream queues: earliest | latest | <offset> "
                       "(default: earliest for batch, latest for streaming)",
    "endingoffsets": "stream queues, batch: latest (default) | <offset> (exclusive)",
    "maxoffsetspertrigger": "stream queues, streaming: at most this many offsets per micro-batch",
    "failondataloss": "stream queues: fail when offsets were truncated by retention "
                      "(default true)",
    "readtimeoutms": "stream queues: max wait for an offset known to exist (default 30000)",
    "probetimeoutms": "stream queues: max wait for the first delivery when locating the head "
                      "or tail of a stream (default 2000)",
}


def _int(opts: Mapping[str, str], key: str, default: int | None, minimum: int = 1) -> int | None:
    raw = opts.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"amqp data source: option '{key}' must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"amqp data source: option '{key}' must be >= {minimum}, got {value}")
    return value


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"amqp data source: option '{key}' must be true or false, got {raw!r}")


def parse_offset_spec(raw: str | int | None, key: str, allowed: tuple[str, ...]) -> str | int | None:
    """'earliest' / 'latest' / a non-negative integer offset (also as JSON ``{"offset": N}``)."""
    if raw is None:
        return None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    else:
        text = str(raw).strip()
        if text.lower() in allowed:
            return text.lower()
        if text.startswith("{"):
            import json
            try:
                text = str(json.loads(text)["offset"])
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"amqp data source: option '{key}' must be "
                                 f"{' | '.join(allowed)} | <offset>, got {raw!r}") from None
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"amqp data source: option '{key}' must be "
                             f"{' | '.join(allowed)} | <offset>, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"amqp data source: option '{key}' must be >= 0, got {value}")
    return value


def normalized(options: Mapping[str, str], known, what: str,
               ignored: tuple[str, ...] = ("path",)) -> tuple[dict, ConnectionParams]:
    """Lower-cased options (unknown names refused) and the parsed, required ``url``."""
    opts = {str(k).lower(): v for k, v in dict(options).items()}
    unknown = sorted(k for k in opts if k not in known and k not in ignored)
    if unknown:
        raise ValueError(f"{what}: unknown option(s) {', '.join(unknown)}; "
                         f"known options: {', '.join(sorted(known))}")
    url = opts.get("url")
    if not url:
        raise ValueError(f"{what}: option 'url' is required "
                         "(e.g. .option('url', 'amqp://guest:guest@localhost:5672/%2F'))")
    try:
        return opts, ConnectionParams.from_url(str(url))
    except ValueError as exc:
        raise ValueError(f"{what}: option 'url': {exc}") from None


@dataclass(frozen=True)
class SourceOptions:
    url: str
    params: ConnectionParams
    queue: str
    queue_type: str = "auto"
    admin_url: str | None = None
    ack_mode: str = "peek"
    max_messages: int | None = None
    num_partitions: int = 1
    batch_size: int = 10000
    idle_timeout: float | None = None      # None: 1 s for batch reads, 0.25 s for streaming
    max_messages_per_trigger: int = 10000
    dedupe: str = "none"
    state_location: str | None = None
    dedupe_window: float = 600.0
    starting_offsets: str | int | None = None
    ending_offsets: str | int = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    read_timeout: float = 30.0
    probe_timeout: float = 2.0
    reconnect_timeout: float = 30.0
    stream_read: str = "auto"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SourceOptions":
        opts, params = normalized(options, KNOWN_OPTIONS, "amqp data source")
        url = opts["url"]
        queue = opts.get("queue") or opts.get("path")
        if not queue:
            raise ValueError("amqp data source: option 'queue' is required "
                             "(e.g. .option('queue', 'orders'))")
        qtype = str(opts.get("queuetype", "auto")).strip().lower()
        if qtype not in QUEUE_TYPES:
            raise ValueError(f"amqp data source: option 'queueType' must be one of "
                             f"{', '.join(QUEUE_TYPES)}, got {opts['queuetype']!r}")
        ack = str(opts.get("ackmode", "peek")).strip().lower()
        if ack not in ACK_MODES:
            raise ValueError(f"amqp data source: option 'ackMode' must be peek or onRead, "
                             f"got {opts['ackmode']!r}")
        num_partitions = _int(opts, "numpartitions", 1)
        starting = parse_offset_spec(opts.get("startingoffsets"), "startingOffsets",
                                     ("earliest", "latest"))
        ending = parse_offset_spec(opts.get("endingoffsets"), "endingOffsets", ("latest",))
        if qtype in ("classic", "quorum"):
            for key in ("startingoffsets", "endingoffsets", "maxoffsetspertrigger"):
                if key in opts:
                    raise ValueError(f"amqp data source: option '{key}' only applies to stream "
                                     f"queues, but queueType is {qtype}")
        dedupe = str(opts.get("dedupe", "none")).strip().lower()
        if dedupe not in DEDUPE_MODES:
            raise ValueError(f"amqp data source: option 'dedupe' must be none or messageId, "
                             f"got {opts['dedupe']!r}")
        if dedupe != "none" and not opts.get("statelocation"):
            raise ValueError("amqp data source: dedupe=messageId needs option 'stateLocation' "
                             "(a directory that survives restarts, one per query)")
        if qtype == "stream":
            for key in ("maxmessagespertrigger", "dedupe"):
                if key in opts:
                    raise ValueError(f"amqp data source: option '{key}' only applies to "
                                     f"classic/quorum queues (a stream is replayed by offset)")
        stream_read = str(opts.get("streamread", "auto")).strip().lower()
        if stream_read not in STREAM_READS:
            raise ValueError(f"amqp data source: option 'streamRead' must be auto, chunks or amqp, "
                             f"got {opts['streamread']!r}")
        if stream_read == "chunks" and not opts.get("adminurl"):
            raise ValueError("amqp data source: streamRead=chunks needs option 'adminUrl' (the "
                             "broker's admin API, e.g. http://host:15672)")
        if qtype == "stream" and "ackmode" in opts:
            raise ValueError("amqp data source: option 'ackMode' only applies to classic/quorum "
                             "queues (reading a stream never removes messages)")
        return cls(
            url=str(url), params=params, queue=str(queue), queue_type=qtype,
            admin_url=(str(opts["adminurl"]).rstrip("/") if opts.get("adminurl") else None),
            ack_mode=ack,
            max_messages=_int(opts, "maxmessages", None, minimum=0),
            num_partitions=num_partitions,
            batch_size=_int(opts, "batchsize", 10000),
            idle_timeout=(None if opts.get("idletimeoutms") in (None, "") else
                          _int(opts, "idletimeoutms", 1000, minimum=0) / 1000.0),
            max_messages_per_trigger=_int(opts, "maxmessagespertrigger", 10000),
            dedupe=dedupe,
            state_location=(str(opts["statelocation"]) if opts.get("statelocation") else None),
            dedupe_window=float(_int(opts, "dedupewindowseconds", 600)),
            starting_offsets=starting,
            ending_offsets=ending if ending is not None else "latest",
            max_offsets_per_trigger=_int(opts, "maxoffsetspertrigger", None),
            fail_on_data_loss=_bool(opts, "failondataloss", True),
            read_timeout=_int(opts, "readtimeoutms", 30000) / 1000.0,
            probe_timeout=_int(opts, "probetimeoutms", 2000) / 1000.0,
            reconnect_timeout=_int(opts, "reconnecttimeoutms", 30000, minimum=0) / 1000.0,
            stream_read=stream_read,
        )

    def idle(self, streaming: bool = False) -> float:
        if self.idle_timeout is not None:
            return self.idle_timeout
        return 0.25 if streaming else 1.0

    def checked(self, queue_type: str) -> "SourceOptions":
        """Checks of a batch read that depend on the queue type (once ``auto`` is resolved)."""
        if queue_type in ("classic", "quorum") and self.ack_mode == "peek" and self.num_partitions > 1:
            raise ValueError(
                "amqp data source: ackMode=peek reads a classic queue with a single consumer "
                "(parallel peeking consumers could see the same message twice once one of them "
                "has put its messages back); use numPartitions=1, ackMode=onRead, or "
                "spark_integration.drain() for a parallel read")
        return self
