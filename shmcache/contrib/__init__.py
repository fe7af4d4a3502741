"""Thin adapters of shmcache to frameworks and libraries, over its public API only: ``shmcache.contrib.django`` (a
Django cache backend) and ``shmcache.contrib.torch`` (``CachedDataset``). Each module imports its library, so
``shmcache`` itself never does; import the one you use."""
