"""Spark integration: AMQP 0-9-1 queues into DataFrames and DataFrames into exchanges.

* ``spark_integration.drain.drain(url, queue, output, ...)`` / ``python -m spark_integration.drain``:
  batch drain of a classic/quorum queue, acking each chunk only after it was written.
* ``register(spark)`` then ``spark.read.format("amqp")`` / ``spark.readStream.format("amqp")``:
  the PySpark data source (stream queues replayed by offset; classic and quorum queues acked
  once Spark committed the micro-batch, optionally deduplicated on message_id);
  ``df.write.format("amqp")`` / ``df.writeStream.format("amqp")``: the sink (confirms).

See spark_integration/README.md for the design, the row schema and the guarantees.
"""

from __future__ import annotations

__all__ = ["register", "AmqpDataSource", "DDL", "COLUMNS"]

from .rows import COLUMNS, DDL


def register(spark) -> None:
    """Register the ``amqp`` data source on a SparkSession."""
    from .source import AmqpDataSource
    spark.dataSource.register(AmqpDataSource)


def __getattr__(name: str):
    if name == "AmqpDataSource":
        from .source import AmqpDataSource
        return AmqpDataSource
    raise AttributeError(f"module 'spark_integration' has no attribute {name!r}")
