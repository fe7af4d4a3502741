"""Stress scripts, run as ``python -m stress.<name> --help``: hammer, kill_storm, fuzz, and tiered (the Redis tier,
with a Redis it starts). Never collected by pytest."""
