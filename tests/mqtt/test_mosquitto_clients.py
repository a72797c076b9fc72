"""Debian's mosquitto_pub and mosquitto_sub (package mosquitto-clients) against the broker."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from eb_support import wait_until

pytestmark = pytest.mark.skipif(shutil.which("mosquitto_sub") is None,
                                reason="mosquitto-clients is not installed (.ci/run installs it)")


def test_mosquitto_sub_receives_what_mosquitto_pub_sends(mqtt_broker):
    port = str(mqtt_broker.mqtt_port)
    sub = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", port, "-u", "guest", "-P", "guest",
                            "-t", "m/+/x", "-q", "1", "-C", "2", "-v", "-i", "msub"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: mqtt_broker.call(
            lambda: "mqtt-subscription-msubqos1" in mqtt_broker.broker.vhosts["/"].queues), 10)
        for i in (1, 2):
            subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-u", "guest", "-P", "guest",
                            "-t", f"m/{i}/x", "-m", f"hello {i}", "-q", "1"], check=True, timeout=20)
        out, err = sub.communicate(timeout=20)
        assert sub.returncode == 0, err
        assert out.splitlines() == ["m/1/x hello 1", "m/2/x hello 2"]
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()


def test_mosquitto_pub_with_a_wrong_password_is_refused(mqtt_broker):
    run = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(mqtt_broker.mqtt_port),
                          "-u", "guest", "-P", "bad", "-t", "t", "-m", "x"],
                         capture_output=True, text=True, timeout=20)
    assert run.returncode != 0
    assert "not authorised" in run.stderr.lower() or "bad user name or password" in run.stderr.lower()


def test_mosquitto_sub_sees_retain_only_on_what_a_new_subscription_gets(mqtt_broker):
    """3.1.1: a retained PUBLISH forwarded to an established subscription has RETAIN 0; the
    retained message a new subscription receives has RETAIN 1 (mosquitto_sub's %r)."""
    port = str(mqtt_broker.mqtt_port)
    base = ["mosquitto_sub", "-h", "127.0.0.1", "-p", port, "-u", "guest", "-P", "guest", "-t", "r/#",
            "-q", "1", "-C", "1", "-F", "%r %t %p"]
    live = subprocess.Popen([*base, "-i", "msub-live"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: mqtt_broker.call(
            lambda: "mqtt-subscription-msub-liveqos1" in mqtt_broker.broker.vhosts["/"].queues), 10)
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-u", "guest", "-P", "guest",
                        "-t", "r/1", "-m", "kept", "-q", "1", "-r"], check=True, timeout=20)
        out, err = live.communicate(timeout=20)
        assert live.returncode == 0, err
        assert out.splitlines() == ["0 r/1 kept"]
        late = subprocess.run([*base, "-i", "msub-late"], capture_output=True, text=True, timeout=20)
        assert late.returncode == 0, late.stderr
        assert late.stdout.splitlines() == ["1 r/1 kept"]
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()
