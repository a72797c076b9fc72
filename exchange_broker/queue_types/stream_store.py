"""The stream's store side (a mixin of ``StreamQueue``): older offsets read back from the store in
shared blocks, named consumer offsets written, and the log's state rebuilt at start-up. Every
store access goes through the durability's ``read`` (off the event loop) and ``write`` (ordered,
on the writer thread)."""

from __future__ import annotations

import logging

from exchange_broker.queue_types.stream_delivery import _read_block

log = logging.getLogger("exchange_broker.stream")

BLOCK = 4096                          # offsets per block read back from the store
BLOCK_CACHE = 8                       # blocks a stream keeps (shared by its consumers)
OFFSET_FLUSH_DELAY = 0.2              # seconds: named offsets are written at most this often


class StoredLog:
    """Store-side methods of StreamQueue (uses its fields: _blocks, _loading, offsets, ...)."""

    def _block(self, offset: int, r) -> "tuple[list, int, int] | None":
        """The cached block holding ``offset`` (starting the read of the next one ahead), or None
        after starting (or joining) its read-back; ``r`` is pumped when it completes."""
        no = offset // BLOCK
        got = self._blocks.get(no)
        if got is not None and offset < got[2]:
            self._blocks.move_to_end(no)
            nxt = no + 1
            if nxt not in self._blocks and nxt not in self._loading and \
                    nxt * BLOCK < self.tail_base and offset - got[1] >= BLOCK // 4:
                self._load(nxt, None)
            return got
        self._load(no, r)
        return None

    def _load(self, no: int, r) -> None:
        waiting = self._loading.get(no)
        if waiting is not None:
            if r is not None:
                waiting.add(r)
            return
        st = self._durability
        start = max(no * BLOCK, self.first_offset)
        end = min((no + 1) * BLOCK, self.tail_base)
        if st is None or start >= end:  # nothing stored there (not expected): skip ahead
            if r is not None:
                r.cursor = max(r.cursor, self.tail_base)
                self.broker.call_later(0, lambda: self._pump(r))
            return
        self._loading[no] = {r} if r is not None else set()
        st.read(_read_block, self.store_id, start, end, self,
                done=lambda got, exc: self._loaded(no, start, end, got, exc))

    def _loaded(self, no: int, start: int, end: int, got, exc) -> None:
        waiting = self._loading.pop(no, set())
        if self.deleted:
            return
        if exc is not None:
            log.error("stream '%s': reading back from the store failed: %s", self.name, exc)
            for r in waiting:
                self.broker.clock.call_later(1.0, self._pump, r)
            return
        blocks = self._blocks
        blocks[no] = (got, start, end)
        blocks.move_to_end(no)
        while len(blocks) > BLOCK_CACHE:
            blocks.popitem(last=False)
        for r in waiting:
            if self.readers.get(r.consumer) is r:
                self._pump(r)

    def committed_end(self) -> int:
        """The offset after the last one whose append is committed (all below it can be read
        from the store, apart from those retention dropped)."""
        pending = self._pending
        while pending and pending[0][1].done:
            pending.popleft()
        return pending[0][0] if pending else self.next_offset

    def query_offset(self, name: str) -> int | None:
        return self.offsets.get(name)

    def set_offset(self, name: str, offset: int, flush: bool = True) -> None:
        self.offsets[name] = int(offset)
        if self._durability is None:
            return
        self._dirty_offsets[name] = int(offset)
        if flush:
            self._flush_offsets()
        elif self._offset_flush is None:
            self._offset_flush = self.broker.clock.call_later(OFFSET_FLUSH_DELAY, self._flush_offsets)

    def _flush_offsets(self) -> None:
        if self._offset_flush is not None:
            self._offset_flush.cancel()
            self._offset_flush = None
        st = self._durability
        if not self._dirty_offsets or st is None or self.deleted:
            return
        items, self._dirty_offsets = self._dirty_offsets, {}
        vhost, queue = self.vhost, self.name

        def write(store) -> None:
            for name, off in items.items():
                store.store_offset(vhost, queue, name, off)
        try:
            st.write(write)
        except RuntimeError:  # writer already stopped (shutdown)
            pass
    # -- recovery -----------------------------------------------------------------------------------
    def restore(self, durability, row: dict, window: int) -> bool:
        """Rebuild the log's state from its stored rows (no message bodies are loaded)."""
        store = durability.store
        count = row.get("message_count") or 0
        max_seq = row.get("max_seq") or 0
        self.next_offset = max_seq
        self.next_seq = max_seq + 1
        self.first_offset = (row.get("min_seq") or 1) - 1 if count else max_seq
        self.tail_base = self.next_offset
        self.offsets = store.load_offsets(self.vhost, self.name)
        if count:
            last_ms = store.log_last_ms(self.store_id)
            if last_ms is not None:
                self.last_ts = last_ms
        segs = [[self.first_offset, 0, 0]]
        total = 0
        if count and (self.max_bytes or self.max_age_ms):
            limit = self.segment_bytes
            seg = segs[0]
            for seq, size, created in store.iter_message_sizes(self.store_id):
                if seg[1] >= limit:
                    seg = [seq - 1, 0, created]
                    segs.append(seg)
                seg[1] += size
                seg[2] = created
                total += size
        elif count:
            total = store.log_bytes(self.store_id)
            segs[0][1], segs[0][2] = total, self.last_ts
        self.segments = segs
        self.total_bytes = total
        return False
