"""Stress scripts, run as ``python -m stress.<name> --help``: hammer, kill_storm, fuzz. Never collected by pytest."""
