"""A sans-IO MQTT client harness: an MQTTSession on a broker with a ManualClock, no sockets."""

from __future__ import annotations

from exchange_broker.assembly import make_broker
from exchange_broker.core.clock import ManualClock
from exchange_broker.mqtt import codec
from exchange_broker.mqtt import packets as p
from exchange_broker.mqtt.hub import MQTTHub, MQTTSettings
from exchange_broker.mqtt.session import MQTTSession


def make_hub(**settings) -> MQTTHub:
    return MQTTHub(make_broker(clock=ManualClock()), MQTTSettings(**settings))


class Peer:
    """One client connection to ``hub``: ``send`` packets, ``received`` decoded packets."""

    def __init__(self, hub: MQTTHub, version: int = p.V311, peer=("127.0.0.1", 40000)) -> None:
        self.hub = hub
        self.version = version
        self.parser = codec.Parser(version=version, server=False)
        self.received: list = []
        self.transport_closed = False
        self.session = MQTTSession(hub, self._write, self._close, peer)

    @property
    def clock(self) -> ManualClock:
        return self.hub.broker.clock

    def _write(self, data: bytes) -> None:
        self.received += self.parser.feed(data)

    def _close(self) -> None:
        self.transport_closed = True

    def send(self, *packets) -> list:
        self.session.data_received(b"".join(codec.encode(x, self.version) for x in packets))
        self.clock.advance(0)
        out, self.received = self.received, []
        return out

    def connect(self, client_id: str = "c1", clean: bool = True, keep_alive: int = 0, user="guest",
                password=b"guest", will=None, props=None) -> p.ConnAck:
        out = self.send(p.Connect(self.version, client_id, clean, keep_alive, user, password, will,
                                  props or {}))
        assert isinstance(out[0], p.ConnAck), out
        self.after_connect = out[1:]  # a persistent session's deliveries follow the CONNACK
        return out[0]
