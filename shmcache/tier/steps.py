"""Each ``TieredCache`` operation written once, for its synchronous API and its asyncio API.

An operation is a generator (``remote.py``'s, ``tiered.py``'s, ``lease.py``'s) that yields a step each time it needs
the outside world, and is sent back the step's result, or has its exception thrown in at the ``yield``, as a plain
call would raise it there:

- ``(REDIS, what, fn)``: ``fn(client, scripts)`` on a redis-py client (``Remote.call``, ``Remote.acall``);
- ``(LOCAL, fn, args)``: ``fn(*args)``, a call on the host's ``SharedCache`` that may wait for its lock (in the
  asyncio API, awaited through ``SharedCache.acall``: in a worker thread when the lock is busy);
- ``(CALL, fn)``: ``fn()``, the caller's function (in the asyncio API, awaited if it returns an awaitable);
- ``(SLEEP, seconds)``.

``run`` drives an operation with blocking calls, ``arun`` with awaits, so the two APIs cannot drift apart: the same
versions, marks, counts, fallbacks and errors. What is not a step (a counter, a decode) runs in the generator.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Generator
from typing import Any

REDIS, LOCAL, CALL, SLEEP = range(4)

Steps = Generator[tuple, Any, Any]


def run(steps: Steps, remote, local=None) -> Any:
    """The result of the operation ``steps``, its steps made with blocking calls (``remote``: its ``Remote``)."""
    send, answer = steps.send, None
    while True:
        try:
            step = send(answer)
        except StopIteration as done:
            return done.value
        try:
            kind = step[0]
            if kind == REDIS:
                answer = remote.call(step[1], step[2])
            elif kind == LOCAL:
                answer = step[1](*step[2])
            elif kind == CALL:
                answer = step[1]()
            else:
                time.sleep(step[1])
            send = steps.send
        except BaseException as exc:  # thrown in where the step was asked for, as a call would raise it there
            answer, send = exc, steps.throw


async def arun(steps: Steps, remote, local) -> Any:
    """``run``, each step awaited (``local``: the ``SharedCache`` whose ``acall`` makes the LOCAL steps)."""
    send, answer = steps.send, None
    while True:
        try:
            step = send(answer)
        except StopIteration as done:
            return done.value
        try:
            kind = step[0]
            if kind == REDIS:
                answer = await remote.acall(step[1], step[2])
            elif kind == LOCAL:
                answer = await local.acall(step[1], *step[2])
            elif kind == CALL:
                answer = step[1]()
                if inspect.isawaitable(answer):
                    answer = await answer
            else:
                await asyncio.sleep(step[1])
            send = steps.send
        except BaseException as exc:  # a cancellation too: the operation's ``finally`` and ``with`` run
            answer, send = exc, steps.throw
