"""The backend chain (core/auth_backends.py) and a login decided later, sans IO: a Session fed raw
bytes on a ManualClock; a backend that "needs the network" is answered by the test, by hand."""

from __future__ import annotations

from pamqp import commands
from pamqp import frame as pframe
from sansio import frames as framed

from exchange_broker.assembly import make_broker
from exchange_broker.connection.session import Session
from exchange_broker.core.auth_backends import (AuthChain, AuthenticatedUser, BackendRefusal,
                                                InternalBackend, LoginRefused)
from exchange_broker.core.clock import ManualClock
from exchange_broker.core.oauth2_scopes import ScopeAuthz
from exchange_broker.testing import client_handshake




def frames(data: bytes) -> list:
    return [f for _channel, f in framed(data)]


class Directory:
    """A backend whose every answer takes the network: ``login`` runs when the test says."""
    name = "ldap"

    def __init__(self, users: dict) -> None:
        self.users = users

    def needs_io(self, username, password):
        return True

    def login(self, username, password, peer_host):
        if username not in self.users:
            return None
        if self.users[username] != password:
            raise BackendRefusal("invalid credentials")
        return AuthenticatedUser(username, ["management"], self.name, ScopeAuthz(["read:*/*", "configure:*/q*"]))


class Later:
    """The offload: keeps the work until ``run_all`` (the executor's thread, by hand)."""

    def __init__(self) -> None:
        self.pending = []

    def __call__(self, fn, on_done):
        self.pending.append((fn, on_done))

    def run_all(self):
        work, self.pending = self.pending, []
        for fn, on_done in work:
            try:
                on_done(fn())
            except Exception as exc:
                on_done(exc)


def test_the_chain_asks_in_order_and_the_first_that_allows_wins():
    broker = make_broker(clock=ManualClock())
    later = Later()
    broker.auth = AuthChain([InternalBackend(broker), Directory({"guest": "dir-pw", "bob": "pw"})], later)
    got = []
    broker.login("guest", "guest", "127.0.0.1", "PLAIN", got.append)  # internal: at once
    assert got[0].name == "guest" and got[0].backend == "internal" and got[0].authz is None
    broker.login("guest", "dir-pw", "127.0.0.1", "PLAIN", got.append)  # internal refuses, ldap allows
    assert len(got) == 1
    later.run_all()
    assert got[1].backend == "ldap"
    broker.login("bob", "bad", "127.0.0.1", "PLAIN", got.append)
    later.run_all()
    assert isinstance(got[2], LoginRefused) and got[2].reasons == [("ldap", "invalid credentials")]
    broker.login("nobody", "x", "127.0.0.1", "PLAIN", got.append)
    later.run_all()
    assert isinstance(got[3], LoginRefused) and got[3].reasons == [("chain", "no backend knows the user")]
    broker.login("bob", None, "127.0.0.1", "EXTERNAL", got.append)  # certificates: internal users only
    assert isinstance(got[4], LoginRefused) and not later.pending


def test_a_failing_backend_refuses_and_the_next_one_is_asked():
    broker = make_broker(clock=ManualClock())
    later = Later()

    class Down(Directory):
        def login(self, *a):
            raise TimeoutError("no answer within 5 s")
    broker.auth = AuthChain([Down({}), InternalBackend(broker)], later)
    got = []
    broker.login("guest", "guest", "127.0.0.1", "PLAIN", got.append)
    later.run_all()
    assert got[0].name == "guest"


def test_a_session_waits_for_a_login_decided_later_then_goes_on_with_what_the_client_sent():
    clock = ManualClock()
    broker = make_broker(clock=clock)
    later = Later()
    broker.auth = AuthChain([InternalBackend(broker), Directory({"bob": "pw"})], later)
    out: list[bytes] = []
    sess = Session(broker, out.append, lambda: None, ("127.0.0.1", 1))
    handshake = client_handshake(1)  # its protocol header; the start-ok is bob's
    start_ok = pframe.marshal(commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                          response="\x00bob\x00pw"), 0)
    rest = (pframe.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0)
            + pframe.marshal(commands.Connection.Open(virtual_host="/"), 0)
            + pframe.marshal(commands.Channel.Open(), 1)
            + pframe.marshal(commands.Queue.Declare(queue="q1"), 1)
            + pframe.marshal(commands.Queue.Declare(queue="x1"), 1))
    sess.data_received(handshake[:8] + start_ok + rest[:30])  # the client sends ahead
    sess.data_received(rest[30:])
    clock.advance()
    assert [type(f).__name__ for f in frames(b"".join(out))] == ["Start"]  # no tune yet
    later.run_all()
    clock.advance()
    got = frames(b"".join(out))
    assert [type(f).__name__ for f in got] == ["Start", "Tune", "OpenOk", "OpenOk", "DeclareOk", "Close"]
    assert got[-1].reply_code == 403 and "queue 'x1'" in got[-1].reply_text  # the directory's grants
    assert sess.user == "bob" and sess.auth_user.backend == "ldap"


def test_a_session_refused_later_gets_403_and_a_lost_one_is_ignored():
    clock = ManualClock()
    broker = make_broker(clock=clock)
    later = Later()
    broker.auth = AuthChain([Directory({"bob": "pw"})], later)
    out: list[bytes] = []
    sess = Session(broker, out.append, lambda: None, ("127.0.0.1", 1))
    sess.data_received(client_handshake()[:8] + pframe.marshal(commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism="PLAIN", response="\x00bob\x00bad"), 0))
    quiet: list[bytes] = []  # no authentication_failure_close: the socket is just closed (RabbitMQ)
    silent = Session(broker, quiet.append, lambda: None, ("127.0.0.1", 3))
    silent.data_received(client_handshake()[:8] + pframe.marshal(commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\x00bob\x00bad"), 0))
    gone = Session(broker, lambda data: None, lambda: None, ("127.0.0.1", 2))
    gone.data_received(client_handshake()[:8] + pframe.marshal(commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\x00bob\x00pw"), 0))
    gone.connection_lost()
    later.run_all()
    clock.advance()
    got = frames(b"".join(out))
    assert type(got[-1]).__name__ == "Close" and got[-1].reply_code == 403
    assert not any(type(f).__name__ == "Close" for f in frames(b"".join(quiet))) and silent.closed
    assert not broker.sessions


class Tokens:
    """A backend of expiring credentials: the password "token-N" is valid until wall time N."""
    name = "oauth2"

    def needs_io(self, username, password):
        return False

    def login(self, username, password, peer_host):
        if not (password or "").startswith("token-"):
            return None
        return AuthenticatedUser(username, [], self.name, ScopeAuthz(["read:*/*", "write:*/*", "configure:*/*"]),
                                 float(password[6:]))


def token_session(clock, broker, expires: float):
    out: list[bytes] = []
    sess = Session(broker, out.append, lambda: None, ("127.0.0.1", 1))
    sess.data_received(client_handshake()[:8] + pframe.marshal(commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response=f"\x00svc\x00token-{expires!r}"), 0)
        + pframe.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0)
        + pframe.marshal(commands.Connection.Open(virtual_host="/"), 0))
    clock.advance()
    return sess, out


def test_a_credential_closes_its_connection_when_it_expires_and_update_secret_moves_that():
    clock = ManualClock()
    broker = make_broker(clock=clock)
    broker.auth = AuthChain([Tokens()])
    now = clock.wall()
    sess, out = token_session(clock, broker, now + 10)
    clock.advance(9.9)
    assert [type(f).__name__ for f in frames(b"".join(out))] == ["Start", "Tune", "OpenOk"]
    sess.data_received(pframe.marshal(commands.Connection.UpdateSecret(f"token-{now + 30!r}", "refresh"), 0))
    clock.advance(0.2)  # past the first credential's expiry: still open
    assert type(frames(b"".join(out))[-1]).__name__ == "UpdateSecretOk"
    clock.advance(20.0)  # past the new one's (now + 30)
    close = frames(b"".join(out))[-1]
    assert type(close).__name__ == "Close" and (close.reply_code, close.reply_text) == (320, "CONNECTION_FORCED - credential expired")


def test_an_expired_credential_at_open_and_a_refused_new_secret():
    clock = ManualClock()
    broker = make_broker(clock=clock)
    broker.auth = AuthChain([Tokens()])
    _, out = token_session(clock, broker, clock.wall() - 1)  # RabbitMQ: the timer fires at once
    clock.advance()
    assert frames(b"".join(out))[-1].reply_code == 320
    sess, out = token_session(clock, broker, clock.wall() + 60)
    sess.data_received(pframe.marshal(commands.Connection.UpdateSecret("not-a-token", "refresh"), 0))
    clock.advance()
    close = frames(b"".join(out))[-1]
    assert (close.reply_code, close.reply_text) == (530, "NOT_ALLOWED - New secret was refused by one of the backends")
