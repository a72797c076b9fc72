"""MQTT packets as plain objects, and the numbers the protocol gives them (MQTT 3.1.1 and 5.0)."""

from __future__ import annotations

from dataclasses import dataclass, field

# packet types (the high nibble of the first byte)
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = range(8, 16)

V31, V311, V5 = 3, 4, 5  # protocol levels in CONNECT
PROTOCOL_NAMES = {V31: "MQIsdp", V311: "MQTT", V5: "MQTT"}
VERSION_TEXT = {V31: "MQTT 3.1", V311: "MQTT 3.1.1", V5: "MQTT 5.0"}

# CONNACK return codes of MQTT 3.1/3.1.1
CONNACK_ACCEPTED = 0
CONNACK_BAD_VERSION = 1
CONNACK_ID_REJECTED = 2
CONNACK_UNAVAILABLE = 3
CONNACK_BAD_CREDENTIALS = 4
CONNACK_NOT_AUTHORIZED = 5

# MQTT 5 reason codes used here
SUCCESS = 0x00
GRANTED_QOS_1 = 0x01
DISCONNECT_WITH_WILL = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_ID_NOT_VALID = 0x85
BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BAD_AUTHENTICATION_METHOD = 0x8C
SERVER_SHUTTING_DOWN = 0x8B
ADMINISTRATIVE_ACTION = 0x98
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
QUOTA_EXCEEDED = 0x97
PAYLOAD_FORMAT_INVALID = 0x99
QOS_NOT_SUPPORTED = 0x9B
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
SUBSCRIPTION_IDS_NOT_SUPPORTED = 0xA1
SUBACK_FAILURE = 0x80  # MQTT 3.1.1's SUBACK failure code (5.0: unspecified error)

# what a 5.0 CONNACK reason becomes for a 3.1.1 client
CONNACK_V3 = {SUCCESS: CONNACK_ACCEPTED, UNSUPPORTED_PROTOCOL_VERSION: CONNACK_BAD_VERSION,
              CLIENT_ID_NOT_VALID: CONNACK_ID_REJECTED, SERVER_UNAVAILABLE: CONNACK_UNAVAILABLE,
              BAD_USER_NAME_OR_PASSWORD: CONNACK_BAD_CREDENTIALS, NOT_AUTHORIZED: CONNACK_NOT_AUTHORIZED}


@dataclass
class Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict = field(default_factory=dict)


@dataclass
class Connect:
    version: int
    client_id: str
    clean_start: bool
    keep_alive: int
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: dict = field(default_factory=dict)


@dataclass
class ConnAck:
    session_present: bool
    code: int
    properties: dict = field(default_factory=dict)


@dataclass
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0
    properties: dict = field(default_factory=dict)


@dataclass
class Ack:
    """PUBACK, PUBREC, PUBREL, PUBCOMP: a packet id and (5.0) a reason code."""
    kind: int
    packet_id: int
    code: int = SUCCESS
    properties: dict = field(default_factory=dict)


@dataclass
class Subscription:
    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass
class Subscribe:
    packet_id: int
    subscriptions: list[Subscription]
    properties: dict = field(default_factory=dict)


@dataclass
class SubAck:
    packet_id: int
    codes: list[int]
    properties: dict = field(default_factory=dict)


@dataclass
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: dict = field(default_factory=dict)


@dataclass
class UnsubAck:
    packet_id: int
    codes: list[int] = field(default_factory=list)
    properties: dict = field(default_factory=dict)


@dataclass
class PingReq:
    pass


@dataclass
class PingResp:
    pass


@dataclass
class Disconnect:
    code: int = SUCCESS
    properties: dict = field(default_factory=dict)


@dataclass
class Auth:
    code: int = SUCCESS
    properties: dict = field(default_factory=dict)
