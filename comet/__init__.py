"""The shared kit: small modules every package of this project may import.

It imports nothing of ours: storage_c, gateway, consumers and spark_jobs all
sit above it.
"""
