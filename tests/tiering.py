"""The suite's tiers: every test module is in exactly one, and its tests carry the tier's marker.

- ``locked``: the tests that cross the locked section (the lock, the structures under it, the calls that take it,
  views and their pins, the stress tools). The path decides what runs there, so CI runs this tier on both paths,
  the compiled section and ``SHMCACHE_PURE_PYTHON=1``, in the manner of CPython's ``TestLRUPy`` / ``TestLRUC``.
- ``unit``: everything that does not depend on the path (codecs, layout, the command line, the framework adapters'
  own logic, the seams): run once.
- ``suites``: third-party test suites run against the caches (Django's, Flask-Caching's, cachetools', aiocache's,
  CPython's mapping tests) and tests that start real servers (Redis, gunicorn, uvicorn, Celery, torch's workers):
  a stage of their own in CI.
- ``lint``: the type checks (mypy over the package and over users' snippets): CI's lint stage, not part of a plain
  ``python -m pytest`` (``-m lint`` runs them).

``python -m pytest`` runs the first three; ``-m locked`` (or ``unit``, ``suites``, ``lint``) one of them. A new test
module must be named here: an unknown one fails the collection, so that no test silently leaves its tier.
"""

from __future__ import annotations

LOCKED = frozenset({
    "test_aio", "test_atomic", "test_cache", "test_codec", "test_core", "test_held", "test_hot_paths", "test_idle",
    "test_interrupts", "test_keylock", "test_kinds", "test_lifecycle", "test_lock", "test_lock_damage", "test_mapping",
    "test_memoize",
    "test_multiprocess", "test_policies", "test_properties", "test_security", "test_single_flight", "test_snapshot",
    "test_records", "test_resize", "test_space", "test_stale", "test_stress", "test_sweep", "test_too_large",
    "test_ttl", "test_unlocked",
    "test_unpack", "test_verify", "test_view",
})
UNIT = frozenset({
    "test_aiocache", "test_benchmarks", "test_cli", "test_dataset_fit", "test_django", "test_flask", "test_hitratio",
    "test_layout", "test_primitives", "test_readme", "test_sdist", "test_seams", "test_serializers", "test_stdtypes",
})
SUITES = frozenset({
    "test_aiocache_suite", "test_cachetools_suite", "test_celery_prefork", "test_django_gunicorn",
    "test_django_suite", "test_fastapi_uvicorn", "test_flask_gunicorn", "test_flask_suite", "test_integrations",
    "test_mapping_protocol", "test_redis_servers", "test_tiered", "test_tiered_aio", "test_tiered_cluster",
    "test_tiered_fleet", "test_tiered_hostile", "test_tiered_races", "test_torch",
})
LINT = frozenset({"test_typing"})
# The modules whose results may hang on the interpreter itself (its C API, frames and reference counts, garbage
# collector, where it runs signal handlers, its standard types): CI runs them on every claimed Python, the whole
# suite on the newest pyenv has, and .ci/nightly the whole locked tier on every one (docs/testing.md, "CI").
VERSIONED = frozenset({
    "test_cache", "test_codec", "test_core", "test_interrupts", "test_lifecycle", "test_stdtypes", "test_stress",
    "test_unpack", "test_view",
})
if not VERSIONED <= LOCKED | UNIT:
    raise ValueError(f"VERSIONED names modules of no tier run on every Python: {sorted(VERSIONED - LOCKED - UNIT)}")
TIERS = {"locked": LOCKED, "unit": UNIT, "suites": SUITES, "lint": LINT}


def tier_of(module: str) -> str:
    """The tier of test module ``module`` (its name without the package); KeyError for one named in no tier."""
    for tier, modules in TIERS.items():
        if module in modules:
            return tier
    raise KeyError(module)
