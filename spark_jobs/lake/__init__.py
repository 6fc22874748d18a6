"""The lake: two Delta Lake tables that ``comet spark-ship`` fills, and ``comet lake``.

Owns the lake's format and everything done to it without Spark: where a lake
lives and its filesystem (``lakefs.py``), the tables' layout (``layout.py``),
their commits through delta-rs (``delta.py``, ``logmirror.py`` for stores
without conditional writes), the schema's growth (``evolve.py``), the run plans
(``plan.py``), the one-run lock (``lock/``), reading the tables (``read.py``) and
the operator's commands: history, compaction and vacuum, the check (``cli.py``).
The format and the ship protocol: ``LAKE.md``.

May import ``storage_c``'s public API, pyarrow and deltalake (the latter only
where a table is touched); never pyspark, nor ``spark_jobs.spark``, which
builds on this package (tests/test_spark_jobs_rooms.py).
"""
