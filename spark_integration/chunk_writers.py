"""How ``drain()`` writes one chunk (an Arrow table) so that it is durable when the call returns.

* ``arrow_chunk_writer`` (engine ``arrow``, the default for Parquet and ORC): pyarrow writes
  the chunk from the driver as one file, under a hidden temporary name, then renames it into
  the output directory (any pyarrow filesystem: local, ``s3://``, ``hdfs://``...).  No Spark
  job per chunk: about 0.1 s per 100,000 rows of 100 B instead of about 2 s.
* ``spark_chunk_writer`` (engine ``spark``; JSON, or when Spark write options are given):
  ``spark.createDataFrame(table).coalesce(1).write...save(output)``, one Spark job per chunk.

Either way readers see a chunk whole or not at all, and the files are the same layout
(``part-...`` files in one directory) that ``spark.read.parquet(output)`` reads.
"""

from __future__ import annotations

import os
import uuid
from typing import Callable

FORMATS = ("parquet", "orc", "json")
ENGINES = ("auto", "arrow", "spark")


def check_format(fmt: str) -> str:
    value = str(fmt).strip().lower()
    if value not in FORMATS:
        raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return value


def pick_engine(engine: str, fmt: str, write_options: dict | None) -> str:
    value = str(engine).strip().lower()
    if value not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    if value == "arrow" and fmt == "json":
        raise ValueError("engine 'arrow' writes parquet or orc; use engine 'spark' for json")
    if value == "auto":
        return "spark" if fmt == "json" or write_options else "arrow"
    return value


def arrow_chunk_writer(output: str, fmt: str = "parquet") -> Callable:
    import pyarrow.fs as pafs
    if "://" in output:
        fs, root = pafs.FileSystem.from_uri(output)
    else:
        fs, root = pafs.LocalFileSystem(), os.path.abspath(output)
    fs.create_dir(root, recursive=True)
    run = uuid.uuid4().hex[:12]

    def write(table, index: int) -> list[str]:
        name = f"part-{index:05d}-{run}.{fmt}"
        tmp = f"{root}/.{name}.tmp"
        with fs.open_output_stream(tmp) as out:
            if fmt == "parquet":
                import pyarrow.parquet as pq
                pq.write_table(table, out)
            else:
                import pyarrow.orc as orc
                orc.write_table(table, out)
        fs.move(tmp, f"{root}/{name}")
        return [f"{root}/{name}" if "://" not in output else f"{output.rstrip('/')}/{name}"]

    return write


def _list_files(spark, path: str) -> set[str] | None:
    """Data files under ``path`` (Hadoop FS, so s3a://, hdfs:// work too); None if unknown."""
    try:
        jvm = spark._jvm
        jpath = jvm.org.apache.hadoop.fs.Path(path)
        fs = jpath.getFileSystem(spark._jsc.hadoopConfiguration())
        if not fs.exists(jpath):
            return set()
        out = set()
        for st in fs.listStatus(jpath):
            name = st.getPath().getName()
            if st.isFile() and not name.startswith(("_", ".")):
                out.add(st.getPath().toString())
        return out
    except Exception:  # Spark Connect or an exotic FS: fall back to reading the directory
        return None


def spark_chunk_writer(spark, output: str, fmt: str = "parquet",
                       write_options: dict | None = None) -> Callable:
    fmt = check_format(fmt)
    opts = dict(write_options or {})

    def write(table, index: int) -> list[str] | None:
        before = _list_files(spark, output)
        df = spark.createDataFrame(table)
        df.coalesce(1).write.format(fmt).mode("append").options(**opts).save(output)
        after = _list_files(spark, output)
        if before is None or after is None:
            return None
        return sorted(after - before)

    return write


