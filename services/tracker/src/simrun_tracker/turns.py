"""Turns: the tracker's submissions and driver steps do the server's own work one at a time, submissions in the
order they came and the driver's steps ahead of them.

Ten request threads working at once under the interpreter's lock each take longer than in turn, and the lock
hands itself to whichever thread wakes, so some wait far longer than others: measured at 10 concurrent clients,
SubmitRun's p99 fell by 12–19% with submissions' turns and its rate rose as much, and by about as much again with
the driver's steps in turns too (benchmarks/tracker_scale.py). A submission steps out of its turn wherever it
waits on something else or its work grows with something else (an environment to resolve, the model's describer,
the learner, an executor, an earlier run's outputs to link) and steps back in ahead of those that never had a
turn; it writes its run's files and fsyncs after its turn. So one slow model, service or disk holds up no other
submission.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

PortT = TypeVar("PortT")


class Turns:
    """A first-come first-served turn, with stepping out and back in ahead of the queue."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._waiting: deque[threading.Lock] = deque()
        """A held lock per waiting thread: the thread giving up the turn releases the first, handing the turn over
        (one thread woken, not every waiting one)."""
        self._taken = False
        self._holder = threading.local()

    @contextmanager
    def turn(self, *, first: bool = False) -> Iterator[None]:
        """Waits for this thread's turn behind those that came first (`first`: ahead of them, as the driver does),
        and gives it up at the end."""
        if self.holding():
            raise RuntimeError("a turn taken twice by one thread")
        self._take(front=first)
        try:
            yield
        finally:
            self._give_up()

    @contextmanager
    def outside(self) -> Iterator[None]:
        """Steps out of this thread's turn while it waits on something else, then back in ahead of the queue (a
        thread without a turn just runs the block)."""
        if not self.holding():
            yield
            return
        self._give_up()
        try:
            yield
        finally:
            self._take(front=True)

    def holding(self) -> bool:
        """Whether this thread has the turn now."""
        return getattr(self._holder, "turn", False)

    def _take(self, *, front: bool) -> None:
        with self._mutex:
            if not self._taken:
                self._taken = True
                self._holder.turn = True
                return
            gate = threading.Lock()
            gate.acquire()
            if front:
                self._waiting.appendleft(gate)
            else:
                self._waiting.append(gate)
        try:
            gate.acquire()  # released by the thread that hands the turn over; `_taken` stays set for this one
        except BaseException:  # interrupted while waiting: out of the queue, or the turn handed on at once
            with self._mutex:
                if gate in self._waiting:
                    self._waiting.remove(gate)
                else:
                    self._hand_over()
            raise
        self._holder.turn = True

    def _give_up(self) -> None:
        self._holder.turn = False
        with self._mutex:
            self._hand_over()

    def _hand_over(self) -> None:
        """Gives the turn to the first waiting thread, or frees it (under `_mutex`)."""
        if self._waiting:
            self._waiting.popleft().release()
        else:
            self._taken = False


def stepping_out(port: PortT, turns: Turns) -> PortT:
    """`port` with each of its methods called outside the caller's turn: a port waits on something else (a
    cluster's API, a learner service, processes); its attributes are the port's own."""
    return cast(PortT, _SteppingOut(port, turns))


class _SteppingOut:
    def __init__(self, port: object, turns: Turns) -> None:
        self._port = port
        self._turns = turns

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._port, name)
        if not callable(value):
            return value
        return _outside(self._turns, value)


def _outside(turns: Turns, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        with turns.outside():
            return function(*args, **kwargs)

    return call
