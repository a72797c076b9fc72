"""MQTT over WebSocket (``--mqtt-ws-port``, path /ws) and over TLS (``--mqtts-port`` with the
--tls-cert/--tls-key files), set up by the real ``exchange-broker serve``; paho on both, and
MQTT <-> MQTT across the three listeners (one hub: the same broker, retained and takeover)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from eb_support import free_port, wait_until
from paho_support import V5, Paho

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "security"))
from sec_helpers import make_pki  # noqa: E402  (tests/security's throwaway PKI)


def test_websocket_and_tls_listeners(spawn_broker, tmp_path):
    pki = make_pki(tmp_path / "pki")
    tcp, ws, tls = free_port(), free_port(), free_port()
    spawn_broker("--mqtt-port", str(tcp), "--mqtt-ws-port", str(ws), "--mqtts-port", str(tls),
                 "--tls-port", "0", "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key))
    over_ws = Paho(ws, "over-ws", websocket=True, version=V5)
    over_tls = Paho(tls, "over-tls", tls_ca=str(pki.ca))
    plain = Paho(tcp, "plain")
    try:
        assert over_ws.accepted and over_tls.accepted
        over_ws.subscribe("x/#", 1)
        over_tls.subscribe("x/#", 1)
        plain.publish("x/1", b"to both", 1)
        assert over_ws.wait_messages(1)[0].payload == b"to both"
        assert over_tls.wait_messages(1)[0].payload == b"to both"
        over_ws.publish("x/2", b"from ws", 1)
        assert wait_until(lambda: [m.payload for m in over_tls.messages] == [b"to both", b"from ws"], 10)
        # takeover across listeners: the same client id over TCP closes the WebSocket one
        Paho(tcp, "over-ws").close()
        assert over_ws.disconnected.wait(10)
    finally:
        for c in (over_ws, over_tls, plain):
            c.close()


def test_websocket_upgrade_elsewhere_than_ws_is_404(spawn_broker):
    ws = free_port()
    spawn_broker("--mqtt-ws-port", str(ws))
    with socket.create_connection(("127.0.0.1", ws), timeout=10) as s:
        s.sendall(b"GET /other HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 404")


def test_mqtts_port_without_tls_files_is_one_line(tmp_path):
    import subprocess
    from eb_support import subprocess_env
    run = subprocess.run([sys.executable, "-m", "exchange_broker", "serve", "--in-memory", "--port", "0",
                          "--mqtts-port", "0"], capture_output=True, text=True, timeout=60,
                         env=subprocess_env({}))
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].endswith("--mqtts-port needs --tls-cert and --tls-key")
