"""The ``comet`` command and the kit every package above the storage shares.

    storage_c   the log: the C engine and its Python binding (the bottom)
    comet       the command (``comet``: the log's own inspection commands
                built in, every other package's loaded by name through the
                ``comet.commands`` entry points) and the shared kit: JSON log
                lines (jsonlog), durable file writes (files), the export
                layout of entries (export), command-line helpers (clikit),
                where an S3 store is and how its clients are configured
                (objectstore), waits between retries (backoff)
    gateway, consumers, spark_jobs   above; each owns its commands

comet imports storage_c's public API and nothing above it; a command of
another package is imported only when it runs.
"""
