"""Runtime parameters of the movers (RabbitMQ's ``/api/parameters/{component}``): their values,
checked, stored (table ``runtime_parameters``) and put to work.

A ``shovel`` parameter is a running shovel (started, replaced, stopped with its parameter); the
supervisor removes the parameter of a shovel that finished (``delete-after``), as RabbitMQ does.
"""

from __future__ import annotations

import asyncio
import json
import logging

from persistence import parameters_store

from exchange_broker.movers import federation_config, shovel_config
from exchange_broker.movers.federation import UPSTREAM, UPSTREAM_SET, Federation
from exchange_broker.movers.amqp import LocalBroker
from exchange_broker.movers.shovel import Shovel
from exchange_broker.movers.supervisor import Key, Supervisor
from exchange_broker.movers.validation import ParameterError

log = logging.getLogger("exchange_broker.movers")

SHOVEL = "shovel"
COMPONENTS = (SHOVEL, UPSTREAM, UPSTREAM_SET)


class UnknownComponent(LookupError):
    pass


class Parameters:
    """The movers' parameters of one broker, and the supervisor running what they describe."""

    def __init__(self, broker, local: LocalBroker) -> None:
        self.broker = broker
        self.durability = broker.durability
        self.local = local
        self.values: dict[Key, object] = {}
        self.supervisor = Supervisor()
        self.supervisor.on_finished = self._finished
        self.federation = Federation(self)  # links follow the policies and these parameters
        self.placement = None  # movers.placement.Placement in a cluster with per-queue leaders
        self._follow: asyncio.Task | None = None

    def mine(self, key: Key) -> bool:
        """This node runs the mover of ``key`` (always, outside a cluster)."""
        return self.placement is None or self.placement.mine(key)

    # -- reading -------------------------------------------------------------------------------
    def list(self, component: str | None = None, vhost: str | None = None) -> list[dict]:
        return [self.item(k) for k in sorted(self.values)
                if (component is None or k[0] == component) and (vhost is None or k[1] == vhost)]

    def item(self, key: Key) -> dict:
        component, vhost, name = key
        return {"value": self.values[key], "vhost": vhost, "component": component, "name": name}

    # -- changing ------------------------------------------------------------------------------
    @staticmethod
    def check(component: str, name: str, value) -> object:
        """The parsed value (ParameterError / UnknownComponent otherwise)."""
        if component == SHOVEL:
            return shovel_config.parse(name, value)
        if component == UPSTREAM:
            return federation_config.parse_upstream(name, value)
        if component == UPSTREAM_SET:
            return federation_config.parse_set(name, value)
        raise UnknownComponent(component)

    def put(self, component: str, vhost: str, name: str, value, *, store: bool = True) -> bool:
        """Set a parameter (True: it is new) and start what it describes."""
        parsed = self.check(component, name, value)
        key = (component, vhost, name)
        new = key not in self.values
        self.values[key] = value
        if store:
            text = json.dumps(value)
            self.durability.write(lambda s: parameters_store.put_parameter(s, component, vhost, name, text))
        self._start(key, parsed)
        return new

    def delete(self, component: str, vhost: str, name: str) -> bool:
        key = (component, vhost, name)
        if self.values.pop(key, None) is None:
            return False
        self.durability.write(lambda s: parameters_store.delete_parameter(s, component, vhost, name))
        self.supervisor.stop(key)
        return True

    def vhost_deleted(self, vhost: str) -> None:
        for key in [k for k in self.values if k[1] == vhost]:
            self.delete(*key)

    def _start(self, key: Key, parsed) -> None:
        if key[0] == SHOVEL:
            if not self.mine(key):
                self.supervisor.stop(key)  # another node runs it
                return
            self.supervisor.start(key, Shovel(key[1], key[2], parsed, self.local, self.broker.cluster_name))
        else:
            self.federation.start()

    def _finished(self, key: Key) -> None:
        if key in self.values:
            self.delete(*key)

    # -- start-up and shut-down ------------------------------------------------------------------
    def restore(self, rows: list[dict], vhosts) -> int:
        """Stored parameters back (``parameters_store.load_parameters``); the unreadable skipped."""
        n = 0
        for row in rows:
            if row["component"] not in COMPONENTS or row["vhost"] not in vhosts:
                continue
            try:
                self.put(row["component"], row["vhost"], row["name"], row["value"], store=False)
                n += 1
            except ParameterError as err:
                log.warning("stored %s parameter '%s' in vhost '%s' skipped: %s", row["component"],
                            row["name"], row["vhost"], str(err).strip())
        return n

    def reconcile(self, rows: list[dict]) -> None:
        """Stored parameters (another node's puts and deletes) into this node, not stored again."""
        stored = {(r["component"], r["vhost"], r["name"]): r["value"] for r in rows if r["component"] in COMPONENTS}
        for key in [k for k in self.values if k not in stored]:
            del self.values[key]
            self.supervisor.stop(key)
        for key, value in stored.items():
            if self.values.get(key) != value and key[1] in self.broker.vhosts:
                try:
                    self.put(*key, value, store=False)
                except ParameterError:
                    pass

    def place(self) -> None:
        """Start the shovels placed on this node that do not run; stop those placed elsewhere."""
        for key in self.values:
            if key[0] != SHOVEL:
                continue
            running = self.supervisor.get(key) is not None
            if self.mine(key) and not running:
                self._start(key, self.check(SHOVEL, key[2], self.values[key]))
            elif running and not self.mine(key):
                self.supervisor.stop(key)

    def follow_store(self, store, placement) -> None:
        """In a cluster: run only the movers placed here, following the shared store."""
        from exchange_broker.movers.placement import follow
        self.placement = placement
        self._follow = asyncio.get_running_loop().create_task(
            follow(self, store, parameters_store.load_parameters), name="movers-follow")

    async def close(self) -> None:
        if self._follow is not None:
            self._follow.cancel()
        await self.federation.close()
        await self.supervisor.close()
