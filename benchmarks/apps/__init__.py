"""Application benchmarks: whole programs (a DataLoader's epochs...) run with and without shmcache. Scripts, never
run by the test suite: ``python -m benchmarks.apps.<name> --help``."""
