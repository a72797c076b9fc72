"""The stream's retention (a mixin of ``StreamQueue``): ``x-max-length-bytes`` and ``x-max-age``,
from queue arguments or policies, drop whole segments from the head of the log (the module
docstring of ``stream.py`` has the rules)."""

from __future__ import annotations

from exchange_broker.queue_types.stream_args import _norm, parse_interval_ms


class Retention:
    """Retention methods of StreamQueue (uses its fields: segments, total_bytes, tail_base ...)."""

    def apply_policy(self, effective: dict, policy: str | None = None,
                     operator_policy: str | None = None) -> None:
        """Retention from policies (max-length-bytes, max-age) applies at once."""
        super().apply_policy(effective, policy, operator_policy)
        self.max_bytes = int(effective.get("x-max-length-bytes") or 0)
        self.max_age_ms = parse_interval_ms(_norm(effective.get("x-max-age"))) or 0
        self.apply_retention()

    # -- retention ----------------------------------------------------------------------------------
    def apply_retention(self, now: int | None = None) -> None:
        segs = self.segments
        if len(segs) < 2 or not (self.max_bytes or self.max_age_ms):
            return
        now = self.broker.now_ms() if now is None else now
        drop = 0
        total = self.total_bytes
        while len(segs) - drop > 1:
            s = segs[drop]
            if (self.max_bytes and total > self.max_bytes) or \
                    (self.max_age_ms and s[2] < now - self.max_age_ms):
                total -= s[1]
                drop += 1
            else:
                break
        if not drop:
            return
        del segs[:drop]
        self.total_bytes = total
        self.truncate(segs[0][0])

    def truncate(self, first: int) -> None:
        """Forget every offset below ``first`` (memory and store)."""
        if first <= self.first_offset:
            return
        self.first_offset = first
        if self.tail_base < first:
            self._drop_tail_before(first)
        st = self._durability
        if st is not None and not self.deleted:
            qid = self.store_id
            st.write(lambda s: s.delete_messages_upto(qid, first))
