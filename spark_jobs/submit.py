"""``comet spark-ship`` as a spark-submit application (absolute imports only:
spark-submit runs this file as a script, outside its package)::

    spark-submit --master yarn spark_jobs/submit.py ./data events s3://bucket/lake [options]

The options are those of ``comet spark-ship``; the master and the Spark
settings come from spark-submit.
"""

import sys

from storage_c.cli import main

if __name__ == "__main__":
    main(["spark-ship", *sys.argv[1:]])
