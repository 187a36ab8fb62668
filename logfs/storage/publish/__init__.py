"""The Spark sink's crash-safe publish: the staged files (staging), the log of commits applied and in flight
(transaction_log), and the publish itself, staged batches appended once per writer (transactions).

Imports the foundation, format and local (the batch statistics); the manager opens it for a data directory.
"""
