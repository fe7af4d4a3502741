"""The Django settings the Django tests run under, configured once per test process (Django's settings are global):
an in-memory SQLite database, the apps sessions and auth need, and whatever apps a caller adds (Django's own cache
test app, for tests/test_django_suite.py). Caches are set per test with ``override_settings``."""

from __future__ import annotations

import pytest

django = pytest.importorskip("django", reason="Django is in the test extra (pip install -e '.[test]')")

from django.conf import settings  # noqa: E402

BASE_APPS = ["django.contrib.sessions"]  # the session engines (the cache one needs no table, the others do)


def configure(extra_apps: tuple[str, ...] = ()) -> None:
    """Configure Django's settings and set it up, once; a later call must not need apps the first did not add."""
    if settings.configured:
        missing = [a for a in extra_apps if a not in settings.INSTALLED_APPS]
        if missing:
            raise RuntimeError(f"Django was configured without {missing}: configure() them first")
        return
    settings.configure(
        DEBUG=False,
        SECRET_KEY="shmcache-tests-only",
        USE_TZ=True,
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        INSTALLED_APPS=BASE_APPS + list(extra_apps),
        CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        SESSION_ENGINE="django.contrib.sessions.backends.cache",
        MIDDLEWARE=[],
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )
    django.setup()


def caches_setting(name: str, **params) -> dict:
    """A CACHES setting whose default alias is a SharedMemoryCache named ``name``."""
    return {"default": {"BACKEND": "shmcache.contrib.django.SharedMemoryCache", "LOCATION": name, **params}}
