"""The Kafka v2 record format: batches (records), their codecs' framing (codecs), and the line format with the
rules for which lines a topic accepts (lines).

Imports only the storage's foundation (errors). Knows nothing of files, segments or logs: everything above reads
and writes bytes through it.
"""
