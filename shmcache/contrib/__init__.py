"""Thin adapters of shmcache to other libraries, over its public API only: ``shmcache.contrib.torch`` (a DataLoader
dataset whose samples are computed once per host). Each module imports its library; this package imports nothing."""
