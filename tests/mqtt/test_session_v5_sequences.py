"""Random MQTT 5 packet sequences from two clients sharing topics (sans-IO, ManualClock), with
subscription options (no-local, retain-as-published, retain handling, identifiers), retained
publishes, topic aliases both ways and AUTH packets: no internal error is ever logged, no-local
never hands a client its own PUBLISH through a no-local-only filter, and a third client still
works afterwards (hypothesis)."""

from __future__ import annotations

import logging

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqtt_sansio import Peer, make_hub

from exchange_broker.mqtt import codec
from exchange_broker.mqtt import packets as p

TOPICS = ["a", "a/b", "a/c"]
FILTERS = ["a", "a/+", "#", "a/b", "$share/g/a/#"]

subscription = st.builds(p.Subscription, st.sampled_from(FILTERS), st.integers(0, 2), st.booleans(),
                         st.booleans(), st.integers(0, 2))
packet = st.one_of(
    st.builds(lambda t, body, q, r, alias, pid: p.Publish(t, body, q, r, False, pid,
                                                          {"topic_alias": alias} if alias else {}),
              st.sampled_from(TOPICS + [""]), st.binary(max_size=8), st.integers(0, 2), st.booleans(),
              st.integers(0, 18), st.integers(1, 4)),
    st.builds(lambda subs_, sid: p.Subscribe(1, subs_, {"subscription_identifier": [sid]} if sid else {}),
              st.lists(subscription, min_size=1, max_size=2), st.integers(0, 3)),
    st.builds(lambda f: p.Unsubscribe(2, [f]), st.sampled_from(FILTERS)),
    st.builds(p.Ack, st.just(p.PUBACK), st.integers(1, 6)),
    st.builds(p.Auth, st.sampled_from([0, 0x18, 0x19])),
    st.just(p.PingReq()))


class Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list = []

    def emit(self, record) -> None:
        self.records.append(record)


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 1), packet), max_size=14), st.integers(0, 4))
def test_random_v5_sequences_keep_the_rules(steps, alias_max):
    errors = Errors()
    logger = logging.getLogger("exchange_broker")
    logger.addHandler(errors)
    try:
        hub = make_hub()
        peers = [Peer(hub, p.V5), Peer(hub, p.V5)]
        for i, peer in enumerate(peers):
            peer.connect(f"c{i}", props={"topic_alias_maximum": alias_max} if alias_max else {})
        for who, x in steps:
            peer = peers[who]
            if peer.session.closed:
                continue
            no_local_only = _no_local_only(peer)
            for other in peers:
                other.received = []
            peer.session.data_received(codec.encode(x, p.V5))
            peer.clock.advance(0)
            if isinstance(x, p.Publish) and x.topic and not peer.session.closed:
                own = [r for r in peer.received if isinstance(r, p.Publish) and r.payload == x.payload
                       and r.topic == x.topic and not r.retain]
                if any(_matches(f, x.topic) for f in no_local_only) and \
                        not any(_matches(f, x.topic) for f in _ordinary(peer)):
                    assert not own, f"no-local delivered {x} back"
        for peer in peers:
            peer.session.connection_lost()
        assert Peer(hub, p.V5).connect("survivor").code == p.SUCCESS
    finally:
        logger.removeHandler(errors)
    assert not errors.records, [r.getMessage() for r in errors.records]


def _no_local_only(peer) -> list[str]:
    return [o.topic_filter for o in peer.session.filters.values() if o.no_local]


def _ordinary(peer) -> list[str]:
    return [o.topic_filter for o in peer.session.filters.values() if not o.no_local]


def _matches(topic_filter: str, topic: str) -> bool:
    from exchange_broker.mqtt.topics import matches
    return matches(topic_filter, topic)
