"""What every MQTT connection of one broker shares: the broker, the open clients by (vhost,
client id) for takeover, the retained messages and the settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from exchange_broker.mqtt.retained import RetainedStore


@dataclass
class MQTTSettings:
    max_packet_size: int = 268_435_455  # RabbitMQ's mqtt.max_packet_size_authenticated default
    vhost: str = "/"                    # RabbitMQ's mqtt.vhost: user names without "vhost:"
    port_vhosts: dict = field(default_factory=dict)  # mqtt_port_to_vhost_mapping: port -> vhost
    ignore_colons_in_username: bool = False  # mqtt.ignore_colons_in_username: no "vhost:user"
    default_user: str = "guest"         # mqtt.default_user / default_pass for anonymous clients
    default_pass: str = "guest"
    allow_anonymous: bool = True        # mqtt.allow_anonymous
    prefetch: int = 10                  # mqtt.prefetch: QoS 1 deliveries awaiting PUBACK
    topic_alias_maximum: int = 16       # MQTT 5: aliases a client may set towards us
    connect_timeout: float = 10.0       # seconds to send CONNECT


class MQTTHub:
    def __init__(self, broker, settings: MQTTSettings | None = None,
                 retained: RetainedStore | None = None) -> None:
        self.broker = broker
        self.settings = settings or MQTTSettings()
        self.clients: dict[tuple[str, str], object] = {}  # (vhost, client id) -> its session
        self.sessions: set = set()                         # every open MQTT connection
        self.retained = retained or RetainedStore()
        self.pending_wills: dict[tuple[str, str], object] = {}  # MQTT 5 will delay: its timer
        self.relays_seen: dict = {}  # a cluster: relayed consumers of subscription queues (takeover.py)
        self.last_tick = 0.0
