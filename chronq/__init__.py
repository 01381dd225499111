"""chronq: Chronicle Queue v5 for Python, a persisted broker-less queue on memory-mapped files."""
