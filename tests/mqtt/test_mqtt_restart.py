"""A persistent MQTT session (clean session off) and retained messages survive a broker restart
(the real ``exchange-broker serve --mqtt-port`` process, SQLite store, killed with SIGKILL)."""

from __future__ import annotations

import pytest
from eb_support import steady_port, wait_until
from paho_support import Paho


@pytest.mark.slow  # two broker start-ups: about 10 s on the loaded machine
def test_persistent_session_and_retained_messages_survive_a_restart(spawn_broker):
    port = steady_port()
    broker = spawn_broker("--mqtt-port", str(port))
    device = Paho(port, "device-1", clean=False)
    try:
        assert device.connack[0] is False  # no session yet
        assert device.subscribe("cmd/device-1/#", 1)[0].value == 1
        device.close()
        sender = Paho(port, "sender")
        for i in range(3):
            sender.publish(f"cmd/device-1/{i}", f"m{i}".encode(), qos=1)  # PUBACK: in the store
        sender.publish("status/plant", b"running", qos=1, retain=True)
        sender.close()
        broker.kill()
        broker.start()
        device = Paho(port, "device-1", clean=False)
        assert device.connack[0] is True  # session present
        got = device.wait_messages(3)
        assert sorted((m.topic, m.payload, m.qos) for m in got) == [
            ("cmd/device-1/0", b"m0", 1), ("cmd/device-1/1", b"m1", 1), ("cmd/device-1/2", b"m2", 1)]
        late = Paho(port, "late")
        late.subscribe("status/#", 1)
        m = late.wait_messages(1)[0]
        assert (m.topic, m.payload, m.retain) == ("status/plant", b"running", True)
        late.close()
        # still subscribed after the restart: new messages arrive too
        sender = Paho(port, "sender2")
        sender.publish("cmd/device-1/after", b"m3", qos=1)
        sender.close()
        assert wait_until(lambda: any(x.payload == b"m3" for x in device.messages), 10)
    finally:
        device.close()
