"""Thin adapters of shmcache to frameworks and libraries, over its public API only: ``shmcache.contrib.django`` (a
Django cache backend), ``shmcache.contrib.flask`` (a Flask-Caching backend) and ``shmcache.contrib.torch``
(``CachedDataset``); ``shmcache.contrib.backends`` holds what the two cache backends share. Each module imports its
library, so ``shmcache`` itself never does; import the one you use."""
