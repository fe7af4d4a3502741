"""A one-file Django site whose cache and sessions live in one shmcache shared by every gunicorn worker.

    SHMCACHE_NAME=site gunicorn -w 3 --chdir examples django_app:application
    SHMCACHE_NAME=site uvicorn --workers 3 --app-dir examples django_app:asgi_application  # ASGI

``GET /set/<key>/<value>`` stores ``{"key", "value", "sum"}`` through Django's cache (``sum``: a digest of key and
value, so a torn or misplaced read is caught); ``GET /get/<key>`` reads it back; ``GET /visit`` counts this
session's visits (``SESSION_ENGINE`` is the cache one: the session lives in the shared cache, so any worker, a
recycled one included, carries it on); ``/aset`` and ``/aget`` are the async views' twins of ``/set`` and ``/get``,
through the backend's native ``aset`` and ``aget``. Every reply names the worker that served it (``pid``; ``/get``
also its thread, for gunicorn's threaded workers: ``-k gthread --threads 4``, whose threads share the process's one
handle).
"""

from __future__ import annotations

import hashlib
import os
import threading

import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY=os.environ.get("DJANGO_SECRET_KEY", "an example's key: set DJANGO_SECRET_KEY for anything real"),
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=["django.contrib.sessions"],
    MIDDLEWARE=["django.contrib.sessions.middleware.SessionMiddleware"],
    SESSION_ENGINE="django.contrib.sessions.backends.cache",
    CACHES={
        "default": {
            "BACKEND": "shmcache.contrib.django.SharedMemoryCache",
            "LOCATION": os.environ.get("SHMCACHE_NAME", "django-example"),
            "OPTIONS": {"capacity_bytes": 16 * 2**20, "max_entries": 10_000},
        }
    },
)
django.setup()

from django.core.cache import cache  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402


def digest(key: str, value: str) -> str:
    return hashlib.sha256(f"{key}\0{value}".encode()).hexdigest()


def set_value(request, key: str, value: str) -> JsonResponse:
    cache.set(key, {"key": key, "value": value, "sum": digest(key, value)})
    return JsonResponse({"pid": os.getpid()})


def get_value(request, key: str) -> JsonResponse:
    return JsonResponse({"pid": os.getpid(), "thread": threading.get_ident(), "found": cache.get(key)})


async def aset_value(request, key: str, value: str) -> JsonResponse:
    await cache.aset(key, {"key": key, "value": value, "sum": digest(key, value)})
    return JsonResponse({"pid": os.getpid()})


async def aget_value(request, key: str) -> JsonResponse:
    return JsonResponse({"pid": os.getpid(), "found": await cache.aget(key)})


def visit(request) -> JsonResponse:
    visits = request.session.get("visits", 0) + 1
    request.session["visits"] = visits
    return JsonResponse({"pid": os.getpid(), "visits": visits})


urlpatterns = [
    path("set/<str:key>/<str:value>", set_value),
    path("get/<str:key>", get_value),
    path("visit", visit),
    path("aset/<str:key>/<str:value>", aset_value),
    path("aget/<str:key>", aget_value),
]
application = get_wsgi_application()
asgi_application = get_asgi_application()
