"""``comet spark-ship`` as a spark-submit application (absolute imports only:
spark-submit runs this file as a script, outside its package)::

    spark-submit --master yarn spark_jobs/spark/submit.py ./data events s3://bucket/lake [options]

The options are those of ``comet spark-ship``; the master and the Spark
settings come from spark-submit.  It runs this package's own command, not
the ``comet`` group, so nothing here goes back through storage_c's CLI.
"""

import sys

from spark_jobs.spark.cli import spark_ship

if __name__ == "__main__":
    spark_ship.main(args=sys.argv[1:], prog_name="comet spark-ship")
