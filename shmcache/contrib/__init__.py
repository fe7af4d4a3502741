"""Thin adapters of shmcache for frameworks, over its public API only: ``shmcache.contrib.django`` (a Django cache
backend). Each module imports its framework, so ``shmcache`` itself never does; import the one you use."""
