"""Benchmarks: shmcache side by side with the stores a worker pool might use instead, in the same run.

``python -m benchmarks.run --help`` runs them. ``peers`` holds one adapter per store (shmcache, cachetools,
``multiprocessing.Manager().dict()``, diskcache, lmdb, Redis over a unix socket), ``workloads`` the five workloads
(W1 latency, W2 multi-process throughput, W3 growth, W4 churn, W5 memory), ``measure`` the timing and memory helpers,
``servers`` the servers they start (the tests' Redis servers, from tests/servers.py, and memcached). Figures are
medians and p99s of individually timed operations and each peer's figure is also given as a ratio to shmcache's;
nothing here passes or fails (behaviour is tested in tests/).
"""
