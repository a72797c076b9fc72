"""Which policy applies to a queue or an exchange, and what it changes (RabbitMQ 3.13's rules).

* Matching (``rabbit_policy:match/2``): the policy's ``apply-to`` covers the object (``queues``,
  ``exchanges``, ``all``, or one queue type: ``classic_queues``, ``quorum_queues``, ``streams``),
  its pattern matches somewhere in the name (an unanchored regex search), and, for a queue, the
  queue's type supports every key of the definition (a policy with one key the type does not
  support does not apply to it at all). Of the matching policies the highest priority wins;
  RabbitMQ leaves ties undefined (storage order): here the name that sorts first wins, so the
  choice is stable across restarts. Operator policies are matched the same way, separately.
* Policy and operator policy (``rabbit_policy:merge_operator_definitions/2``): numeric limits
  take the lower of the two; ``overflow``, ``queue-version`` and booleans the operator's value;
  other keys come from whichever has them.
* Queue arguments against that merged value (each queue type's ``args_policy_lookup`` rules):
  classic queues take the lower of argument and policy for TTL, expiry and length limits, and
  keep their own ``x-dead-letter-*`` and ``x-overflow``; quorum queues likewise, except that the
  policy's ``overflow`` and ``expires`` win; for streams the policy wins.
* Exchanges: an ``alternate-exchange`` argument wins over the policy's.

:class:`VHostPolicies` is a vhost's registry: it stores changes through the broker's durability
(``policy_set`` / ``policy_cleared``) and applies them at once to the vhost's queues
(``QueueType.apply_policy``) and exchanges (``Exchange.alternate_exchange``). No IO here.
"""

from __future__ import annotations

import logging

from exchange_broker.core.policy_defs import (OPERATOR_POLICY, POLICY, Policy, PolicyError,  # noqa: F401
                                              parse_policy)
from exchange_broker.protocol.errors import AMQPError

log = logging.getLogger("exchange_broker.policies")

# keys a queue type does not support: a policy holding one does not apply to such a queue
UNSUPPORTED = {
    "classic": frozenset((
        "max-age", "stream-max-segment-size-bytes", "queue-leader-locator", "initial-cluster-size",
        "delivery-limit", "dead-letter-strategy", "max-in-memory-length", "max-in-memory-bytes",
        "target-group-size")),
    "quorum": frozenset((
        "max-priority", "queue-mode", "single-active-consumer", "ha-mode", "ha-params", "ha-sync-mode",
        "ha-promote-on-shutdown", "ha-promote-on-failure", "queue-master-locator", "max-age",
        "stream-max-segment-size-bytes", "initial-cluster-size")),
    "stream": frozenset((
        "expires", "message-ttl", "dead-letter-exchange", "dead-letter-routing-key", "max-length",
        "max-in-memory-length", "max-in-memory-bytes", "max-priority", "overflow", "queue-mode",
        "single-active-consumer", "delivery-limit", "ha-mode", "ha-params", "ha-sync-mode",
        "ha-promote-on-shutdown", "ha-promote-on-failure", "queue-master-locator",
        "dead-letter-strategy", "target-group-size")),
}
APPLY_TO_TYPE = {"classic_queues": "classic", "quorum_queues": "quorum", "streams": "stream"}

MIN, ARG, POL = "min", "arg", "policy"   # lower value wins / queue argument wins / policy wins
RESOLUTION = {   # queue type -> (policy key, queue argument, rule)
    "classic": (("expires", "x-expires", MIN), ("message-ttl", "x-message-ttl", MIN),
                ("max-length", "x-max-length", MIN), ("max-length-bytes", "x-max-length-bytes", MIN),
                ("dead-letter-exchange", "x-dead-letter-exchange", ARG),
                ("dead-letter-routing-key", "x-dead-letter-routing-key", ARG),
                ("overflow", "x-overflow", ARG), ("consumer-timeout", "x-consumer-timeout", MIN)),
    "quorum": (("expires", "x-expires", POL), ("message-ttl", "x-message-ttl", MIN),
               ("max-length", "x-max-length", MIN), ("max-length-bytes", "x-max-length-bytes", MIN),
               ("delivery-limit", "x-delivery-limit", MIN), ("overflow", "x-overflow", POL),
               ("dead-letter-exchange", "x-dead-letter-exchange", ARG),
               ("dead-letter-routing-key", "x-dead-letter-routing-key", ARG),
               ("dead-letter-strategy", "x-dead-letter-strategy", ARG),
               ("consumer-timeout", "x-consumer-timeout", MIN)),
    "stream": (("max-length-bytes", "x-max-length-bytes", POL), ("max-age", "x-max-age", POL),
               ("stream-max-segment-size-bytes", "x-stream-max-segment-size-bytes", POL),
               ("stream-filter-size-bytes", "x-stream-filter-size-bytes", POL)),
}
LOWER_WINS = frozenset(("message-ttl", "max-length", "max-length-bytes", "max-in-memory-length",
                        "max-in-memory-bytes", "expires", "delivery-limit"))
OPERATOR_WINS = frozenset(("overflow", "queue-version", "ha-sync-mode"))


# ---- matching ---------------------------------------------------------------------------------------
def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def queue_type_of(q) -> str:
    return getattr(q, "queue_type", "classic") or "classic"


def applies_to_queue(p: Policy, name: str, queue_type: str) -> bool:
    if p.apply_to not in ("all", "queues") and APPLY_TO_TYPE.get(p.apply_to) != queue_type:
        return False
    unsupported = UNSUPPORTED.get(queue_type, UNSUPPORTED["classic"])
    if any(k in unsupported for k in p.definition):
        return False
    return p.regex.search(name) is not None


def applies_to_exchange(p: Policy, name: str) -> bool:
    return p.apply_to in ("all", "exchanges") and p.regex.search(name) is not None


def best(candidates) -> Policy | None:
    """The highest priority; among equals the first name."""
    chosen = None
    for p in candidates:
        if chosen is None or p.priority > chosen.priority or \
                (p.priority == chosen.priority and p.name < chosen.name):
            chosen = p
    return chosen


# ---- precedence -----------------------------------------------------------------------------------
def merge_value(key: str, value, op_value):
    """rabbit_policy:merge_policy_value/3: a policy's and an operator policy's value of one key."""
    if key in LOWER_WINS and _is_number(value) and _is_number(op_value):
        return min(value, op_value)
    if key == "target-group-size" and _is_number(value) and _is_number(op_value):
        return max(value, op_value)
    return op_value   # overflow, queue-version, booleans, mirroring: the operator's


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def merged_definition(policy: Policy | None, op: Policy | None) -> dict:
    """The effective policy definition (what /api/queues shows)."""
    if policy is None and op is None:
        return {}
    if op is None or policy is None:
        return dict((policy or op).definition)
    out = dict(policy.definition)
    for key, op_value in op.definition.items():
        out[key] = merge_value(key, out[key], op_value) if key in out else op_value
    return dict(sorted(out.items()))


def effective_arguments(declared: dict, queue_type: str, merged: dict) -> dict:
    """The queue's arguments in force: the declared ``x-`` arguments with the merged policy
    definition applied by the queue type's rules."""
    out = dict(declared)
    for key, arg, rule in RESOLUTION.get(queue_type, RESOLUTION["classic"]):
        if key not in merged:
            continue
        value = merged[key]
        if key == "consumer-timeout" and not (_is_number(value) and value >= 1):
            continue  # 0 would be refused as an argument; RabbitMQ treats it as no timeout
        have = declared.get(arg)
        if have is None:
            out[arg] = value
        elif rule == POL:
            out[arg] = value
        elif rule == MIN and _is_number(have) and _is_number(value):
            # delivery-limit (RabbitMQ 4 resolve_delivery_limit/2): a negative value is "no
            # limit", so with one negative the higher wins
            negative = key == "delivery-limit" and (have < 0 or value < 0)
            out[arg] = max(have, value) if negative else min(have, value)
    if out.get("x-dead-letter-exchange") is None and "x-dead-letter-routing-key" not in declared:
        out.pop("x-dead-letter-routing-key", None)  # a policy's routing key without any DLX: inert
    return out


def exchange_alternate(ex, merged: dict) -> str | None:
    """The alternate exchange in force: the argument, else the policy's."""
    ae = _text(ex.arguments.get("alternate-exchange"))
    if not (isinstance(ae, str) and ae):
        ae = merged.get("alternate-exchange")
    return ae if isinstance(ae, str) and ae else None


# ---- a vhost's registry -----------------------------------------------------------------------------
class VHostPolicies:
    """The policies and operator policies of one vhost, applied to its queues and exchanges."""

    def __init__(self, vhost) -> None:
        self.vhost = vhost
        self.tables: dict[str, dict[str, Policy]] = {POLICY: {}, OPERATOR_POLICY: {}}
        self.exchange_policies: dict[str, tuple[str | None, str | None]] = {}

    def __bool__(self) -> bool:
        return bool(self.tables[POLICY] or self.tables[OPERATOR_POLICY])

    def list(self, kind: str) -> list[Policy]:
        return list(self.tables[kind].values())

    def get(self, kind: str, name: str) -> Policy | None:
        return self.tables[kind].get(name)

    # -- changes ----------------------------------------------------------------------------------
    def set(self, policy: Policy, *, store: bool = True, apply: bool = True) -> bool:
        """Add or replace; True when it is new. Stored, then applied to every queue and exchange."""
        table = self.tables[policy.kind]
        created = policy.name not in table
        table[policy.name] = policy
        if store:
            self.vhost.broker.durability.policy_set(policy)
        log.info("%s '%s' set in vhost '%s': pattern %r, apply-to %s, priority %s",
                 "operator policy" if policy.kind == OPERATOR_POLICY else "policy", policy.name,
                 self.vhost.name, policy.pattern, policy.apply_to, policy.priority)
        if store and policy.kind == POLICY:
            self.vhost.broker.event("policy.set", {
                "name": (self.vhost.name, policy.name), "pattern": policy.pattern, "apply-to": policy.apply_to,
                "definition": dict(policy.definition), "priority": policy.priority})
        if apply:
            self.apply_all()
        return created

    def clear(self, kind: str, name: str, *, store: bool = True) -> bool:
        """Remove (False: there was none); what it applied to goes back to the next match."""
        if self.tables[kind].pop(name, None) is None:
            return False
        if store:
            self.vhost.broker.durability.policy_cleared(kind, self.vhost.name, name)
        log.info("%s '%s' cleared in vhost '%s'", "operator policy" if kind == OPERATOR_POLICY else "policy",
                 name, self.vhost.name)
        if store and kind == POLICY:
            self.vhost.broker.event("policy.cleared", {"name": (self.vhost.name, name)})
        self.apply_all()
        return True

    # -- matching -----------------------------------------------------------------------------------
    def match_queue(self, name: str, queue_type: str) -> tuple[Policy | None, Policy | None]:
        t = self.tables
        return (best(p for p in t[POLICY].values() if applies_to_queue(p, name, queue_type)),
                best(p for p in t[OPERATOR_POLICY].values() if applies_to_queue(p, name, queue_type)))

    def match_exchange(self, name: str) -> tuple[Policy | None, Policy | None]:
        t = self.tables
        return (best(p for p in t[POLICY].values() if applies_to_exchange(p, name)),
                best(p for p in t[OPERATOR_POLICY].values() if applies_to_exchange(p, name)))

    def effective_definition(self, policy: str | None, operator_policy: str | None) -> dict:
        return merged_definition(self.tables[POLICY].get(policy) if policy else None,
                                 self.tables[OPERATOR_POLICY].get(operator_policy) if operator_policy else None)

    # -- applying -----------------------------------------------------------------------------------
    def apply_all(self) -> None:
        for q in list(self.vhost.queues.values()):
            self.apply_queue(q)
        live = self.vhost.exchanges
        for name in [n for n in self.exchange_policies if n not in live]:
            del self.exchange_policies[name]
        for ex in list(live.values()):
            self.apply_exchange(ex)

    def apply_queue(self, q) -> None:
        """Hand the queue its arguments in force when they (or its policies) changed."""
        if not self and q.policy is None and q.operator_policy is None:
            return  # the common case: no policies in this vhost
        policy, op = self.match_queue(q.name, queue_type_of(q))
        if policy is None and op is None and q.effective_arguments is None:
            return
        merged = merged_definition(policy, op)
        args = effective_arguments(q.arguments, queue_type_of(q), merged)
        pname = policy.name if policy else None
        opname = op.name if op else None
        if (pname, opname, args) == (q.policy, q.operator_policy, q.effective_arguments):
            return
        try:
            q.apply_policy(args, pname, opname)
        except AMQPError as err:  # a combination the queue type refuses: keep what it had
            log.warning("policy %r / operator policy %r not applied to queue '%s' in vhost '%s': %s",
                        pname, opname, q.name, q.vhost, err.text)

    def apply_exchange(self, ex) -> None:
        if not self and ex.name not in self.exchange_policies:
            return
        policy, op = self.match_exchange(ex.name)
        names = (policy.name if policy else None, op.name if op else None)
        if names == (None, None):
            self.exchange_policies.pop(ex.name, None)
        else:
            self.exchange_policies[ex.name] = names
        ex.alternate_exchange = exchange_alternate(ex, merged_definition(policy, op))

    # -- start-up -----------------------------------------------------------------------------------
    def restore(self, kind: str, name: str, value: dict) -> Policy | None:
        """A stored policy back into the registry (not stored again, applied by apply_all)."""
        try:
            policy = parse_policy(kind, self.vhost.name, name, value.get("pattern"), value.get("definition"),
                                  value.get("priority"), value.get("apply-to"))
        except PolicyError as err:
            log.warning("stored %s '%s' in vhost '%s' is not valid, ignored: %s", kind, name,
                        self.vhost.name, " ".join(err.errors))
            return None
        self.tables[kind][name] = policy
        return policy
