"""paho-mqtt clients for the tests: connected synchronously, their messages collected."""

from __future__ import annotations

import threading

import paho.mqtt.client as mqtt
from eb_support import wait_until

V311, V5 = mqtt.MQTTv311, mqtt.MQTTv5


class Paho:
    """A paho client on its own network thread; ``messages`` collects what it receives."""

    def __init__(self, port: int, client_id: str = "", *, version=V311, clean: bool = True,
                 user: str | None = "guest", password: str | None = "guest", will=None,
                 keepalive: int = 60, properties=None, clean_start=None, websocket: bool = False,
                 tls_ca: str | None = None) -> None:
        kwargs = {"clean_session": clean} if version != V5 else {}
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version,
                                  transport="websockets" if websocket else "tcp", **kwargs)
        if websocket:
            self.client.ws_set_options(path="/ws")
        if tls_ca is not None:
            self.client.tls_set(ca_certs=tls_ca)
        self.version = version
        self.messages: list = []
        self.connack = None          # (session present, reason code)
        self.disconnected = threading.Event()
        self.disconnect_reason = None
        self.subacks: dict = {}
        self.unsubacks: dict = {}
        self.pubacks: dict = {}      # mid -> PUBACK reason code (MQTT 5)
        c = self.client
        c.on_connect = self._on_connect
        c.on_message = lambda _c, _u, m: self.messages.append(m)
        c.on_disconnect = self._on_disconnect
        c.on_subscribe = lambda _c, _u, mid, codes, _p: self.subacks.__setitem__(mid, codes)
        c.on_unsubscribe = lambda _c, _u, mid, codes, _p: self.unsubacks.__setitem__(mid, codes)
        c.on_publish = lambda _c, _u, mid, code, _p: self.pubacks.__setitem__(mid, code)
        if user is not None:
            c.username_pw_set(user, password)
        if will is not None:
            c.will_set(*will)
        self.port = port
        c.reconnect_delay_set(60, 120)  # the tests reconnect by hand
        connect_kwargs = {"keepalive": keepalive}
        if version == V5:
            connect_kwargs["clean_start"] = True if clean_start is None else clean_start
            if properties is not None:
                connect_kwargs["properties"] = properties
        c.connect("127.0.0.1", port, **connect_kwargs)
        c.loop_start()
        assert wait_until(lambda: self.connack is not None or self.disconnected.is_set(), 10), \
            "no CONNACK"

    def _on_connect(self, _c, _u, flags, reason, props) -> None:
        self.connack_properties = props
        self.connack = (flags.session_present, reason)

    def _on_disconnect(self, _c, _u, _flags, reason, _props) -> None:
        self.disconnect_reason = reason
        self.disconnected.set()

    @property
    def accepted(self) -> bool:
        return self.connack is not None and not self.connack[1].is_failure

    def subscribe(self, topic: str, qos: int = 1, **kw) -> list:
        _rc, mid = self.client.subscribe(topic, qos, **kw)
        assert wait_until(lambda: mid in self.subacks, 10), "no SUBACK"
        return self.subacks[mid]

    def unsubscribe(self, topic: str):
        _rc, mid = self.client.unsubscribe(topic)
        assert wait_until(lambda: mid in self.unsubacks, 10), "no UNSUBACK"
        return self.unsubacks[mid]

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, **kw):
        info = self.client.publish(topic, payload, qos, retain, **kw)
        if qos:
            info.wait_for_publish(10)
            assert info.is_published()
        return info

    def wait_messages(self, n: int, timeout: float = 10.0) -> list:
        assert wait_until(lambda: len(self.messages) >= n, timeout), \
            f"{len(self.messages)} of {n} messages: {[m.payload for m in self.messages]}"
        return self.messages

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def drop(self) -> None:
        """Abrupt: the socket closes without DISCONNECT (the will goes out)."""
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            sock.close()
