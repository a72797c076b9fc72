"""Which federation links should run: every ``SCAN_INTERVAL`` s (only while the vhost has
upstreams), the exchanges and queues whose policy names ``federation-upstream-set`` (``all``: every
upstream of the vhost) or ``federation-upstream`` get one link per upstream; links no longer wanted,
or whose upstream changed, are stopped or restarted (RabbitMQ's federation plugin)."""

from __future__ import annotations

import asyncio
import logging

from exchange_broker.core.policies import queue_type_of
from exchange_broker.movers import federation_config
from exchange_broker.movers.federation_links import ExchangeLink, QueueLink

log = logging.getLogger("exchange_broker.movers")

UPSTREAM, UPSTREAM_SET = "federation-upstream", "federation-upstream-set"
EXCHANGE_LINK, QUEUE_LINK = "federation-exchange", "federation-queue"
SCAN_INTERVAL = 1.0


class Federation:
    def __init__(self, params) -> None:
        self.params = params  # movers.parameters.Parameters: values, supervisor, broker, local
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._scan_forever(), name="federation")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _scan_forever(self) -> None:
        while True:
            try:
                self.scan()
            except Exception:  # noqa: BLE001 - the next scan tries again
                log.exception("federation: scanning the policies failed")
            await asyncio.sleep(SCAN_INTERVAL)

    def _upstreams(self, vhost: str, definition: dict) -> list:
        values = self.params.values
        if UPSTREAM_SET in definition:
            name = definition[UPSTREAM_SET]
            if name == "all":
                members = [{"upstream": k[2]} for k in values if k[0] == UPSTREAM and k[1] == vhost]
            else:
                members = values.get((UPSTREAM_SET, vhost, name)) or []
        elif UPSTREAM in definition:
            members = [{"upstream": definition[UPSTREAM]}]
        else:
            return []
        out = []
        for m in members:
            value = values.get((UPSTREAM, vhost, m.get("upstream")))
            if value is not None:
                overrides = {k: v for k, v in m.items() if k != "upstream"}
                out.append(federation_config.upstream(m["upstream"], value, overrides))
        return out

    def wanted(self) -> dict:
        """``{supervisor key: (link class, local name, Upstream)}`` for every link the policies ask for."""
        out = {}
        vhosts_with_upstreams = {k[1] for k in self.params.values if k[0] == UPSTREAM}
        for vname in vhosts_with_upstreams:
            vh = self.params.broker.vhosts.get(vname)
            if vh is None or not vh.policies:
                continue
            for ex in vh.exchanges.values():
                if ex.name == "" or ex.name.startswith("amq."):
                    continue
                policy, _op = vh.policies.match_exchange(ex.name)
                for up in self._upstreams(vname, policy.definition if policy else {}):
                    out[(EXCHANGE_LINK, vname, f"{ex.name} <- {up.name}")] = (ExchangeLink, ex.name, up)
            for q in vh.queues.values():
                policy, _op = vh.policies.match_queue(q.name, queue_type_of(q))
                for up in self._upstreams(vname, policy.definition if policy else {}):
                    out[(QUEUE_LINK, vname, f"{q.name} <- {up.name}")] = (QueueLink, q.name, up)
        return out

    def scan(self) -> None:
        sup, p = self.params.supervisor, self.params
        wanted = {k: v for k, v in self.wanted().items() if p.mine(k)}  # in a cluster: those placed here
        for key, _mover, _status in sup.entries():
            if key[0] in (EXCHANGE_LINK, QUEUE_LINK) and key not in wanted:
                sup.stop(key)
        for key, (kind, name, up) in wanted.items():
            running = sup.get(key)
            if running is None or running[0].upstream != up:
                sup.start(key, kind(p.broker, key[1], name, up, p.local))
