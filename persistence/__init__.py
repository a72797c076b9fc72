"""Durable store of the broker: definitions and persistent messages in SQLite or PostgreSQL."""

from .sql_store import SqlStore
from .store import Definitions, Store, StoredMessage
from .writer import GroupCommitWriter

__all__ = ["Definitions", "GroupCommitWriter", "SqlStore", "Store", "StoredMessage"]
