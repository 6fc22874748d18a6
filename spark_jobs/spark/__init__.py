"""The Spark parts: the ``comet`` data source and the ``comet spark-ship`` job.

Owns what runs with a JVM or inside Spark's executors: the session and the
data source's registration (``session.py``, ``source.py``, ``offsets.py``),
Spark's schema language (``schema.py``), the JVM's log lines
(``jvm_output.py``, ``log4j2.properties``), and the ship job - the run on
the driver (``ship.py``), its tasks that parse a range of the log
(``arrow.py``, ``otlp_rows.py``, ``otlp_schema.py``) and write it as Parquet
(``writer.py``), the command and its spark-submit script (``cli.py``,
``submit.py``).

May import ``storage_c``'s public API, pyspark (inside functions where the
module is also used without a JVM) and ``spark_jobs.lake``, which writes
the Delta tables the job commits to.
"""
