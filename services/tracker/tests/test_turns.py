"""Turns: first come first served, a thread that steps out comes back ahead of the queue, a failure gives the
turn up."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from simrun_tracker.turns import Turns, stepping_out
from test_executor_contract import eventually as wait_until  # the executor tests' poll


def test_turns_go_in_the_order_threads_asked_and_never_two_at_once() -> None:
    turns = Turns()
    order: list[int] = []
    inside = 0
    most_inside = 0
    counted = threading.Lock()

    def take(number: int) -> None:
        nonlocal inside, most_inside
        with turns.turn():
            with counted:
                inside += 1
                most_inside = max(most_inside, inside)
            order.append(number)
            time.sleep(0.01)
            with counted:
                inside -= 1

    threads = []
    with turns.turn():  # every thread queues behind this one, in the order it is started
        for number in range(8):
            thread = threading.Thread(target=take, args=(number,))
            thread.start()
            threads.append(thread)
            wait_until(lambda n=number: len(turns._waiting) == n + 1)
    for thread in threads:
        thread.join(timeout=10)
    assert order == list(range(8))
    assert most_inside == 1


def test_a_thread_that_steps_out_comes_back_ahead_of_those_queued() -> None:
    turns = Turns()
    order: list[str] = []
    stepped_out, come_back = threading.Event(), threading.Event()

    def waits_outside() -> None:
        with turns.turn():
            order.append("first in")
            with turns.outside():
                stepped_out.set()
                come_back.wait(10)
            order.append("first back")

    def queued(name: str) -> None:
        with turns.turn():
            order.append(name)
            if name == "second":
                come_back.set()
                wait_until(lambda: len(turns._waiting) == 2)  # the first, ahead of the third

    first = threading.Thread(target=waits_outside)
    first.start()
    stepped_out.wait(10)
    with turns.turn():  # holds the turn while the others queue: the second, then the third
        second = threading.Thread(target=queued, args=("second",))
        second.start()
        wait_until(lambda: len(turns._waiting) == 1)
        third = threading.Thread(target=queued, args=("third",))
        third.start()
        wait_until(lambda: len(turns._waiting) == 2)
    for thread in (first, second, third):
        thread.join(timeout=10)
    assert order == ["first in", "second", "first back", "third"]


def test_a_failure_gives_the_turn_up_and_a_thread_without_a_turn_runs_outside_blocks_as_they_are() -> None:
    turns = Turns()
    with pytest.raises(ValueError), turns.turn():
        raise ValueError("in the turn")
    assert not turns.holding()
    with turns.outside():  # no turn: nothing to give up or take back
        assert not turns.holding()
    done = threading.Event()
    threading.Thread(target=lambda: (turns.turn().__enter__(), done.set())).start()
    assert done.wait(5), "the turn was not given up after the failure"


def test_a_turn_is_not_taken_twice_by_one_thread() -> None:
    turns = Turns()
    with turns.turn(), pytest.raises(RuntimeError, match="twice"), turns.turn():
        pass


def test_a_thread_interrupted_while_it_waits_leaves_the_queue() -> None:
    """A signal's exception in a waiting thread takes it out of the queue: it does not keep a place that would
    swallow the turn when it came."""

    class Interrupted(Exception):
        pass

    def interrupt(_signum: int, _frame: object) -> None:
        raise Interrupted

    turns = Turns()
    holding, give_up = threading.Event(), threading.Event()

    def holds() -> None:
        with turns.turn():
            holding.set()
            give_up.wait(10)

    holder = threading.Thread(target=holds)
    holder.start()
    holding.wait(10)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Interrupted), turns.turn():  # waits in this (the main) thread, which takes the signal
            pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not turns._waiting and not turns.holding()
    give_up.set()
    holder.join(timeout=10)
    with turns.turn():  # free again: the interrupted thread's place swallowed nothing
        assert turns.holding()


def test_a_port_stepped_out_of_is_called_outside_the_turn_and_keeps_its_attributes() -> None:
    """The driver's ports (`stepping_out`): while one of their methods waits, another thread takes the turn; the
    port's attributes and errors are its own."""
    turns = Turns()
    calling, answer = threading.Event(), threading.Event()

    class Port:
        ordering = "driver"

        def call(self, value: int) -> int:
            calling.set()
            answer.wait(10)
            return value * 2

        def refuse(self) -> None:
            raise LookupError("refused")

    port = stepping_out(Port(), turns)
    assert port.ordering == "driver"
    result: list[int] = []

    def in_turn() -> None:
        with turns.turn(first=True):
            result.append(port.call(21))
            assert turns.holding()  # back in its turn once the port answered

    thread = threading.Thread(target=in_turn)
    thread.start()
    calling.wait(10)
    with turns.turn():  # taken while the port's call waits
        answer.set()
    thread.join(timeout=10)
    assert result == [42]
    with turns.turn(), pytest.raises(LookupError, match="refused"):
        port.refuse()
    assert not turns.holding()
