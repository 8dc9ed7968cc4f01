"""Incremental structures of the simulator: the queue in each order and the machines sorted for best fit.

Both exist so that the cost of an event does not grow with the flow: the queue is touched only where
a process enters or starts, the machine index only where a machine's free resources change. Each
gives exactly what the full computation it replaces would give (the tests compare them by hypothesis).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, insort
from collections.abc import Iterator
from typing import Final

import numpy as np

__all__ = ["COMPILED", "TOL", "MachineIndex", "OrderedQueue", "rint", "round9", "search"]

TOL: Final = 1e-9
"""Absolute slack for comparisons of sums of cores and memory, which accumulate rounding."""

COMPILED: Final = not __file__.endswith(".py")
"""Whether this module runs compiled by mypyc. A few searches then take a loop mypyc turns into C
instead of the :mod:`bisect` function, which is faster only when called from the interpreter; both
give the same index."""

# round() without leaving floats: for |x| < 2⁵¹, (x + 1.5 × 2⁵²) - 1.5 × 2⁵² is x rounded to an
# integer, half to even, exactly as round(x) (the sum lies where consecutive floats are 1 apart).
_ROUNDER: Final = 6755399441055744.0
_ROUNDABLE: Final = 2251799813685248.0


def rint(x: float) -> float:
    """``float(round(x))`` (half to even), and ``x`` itself when infinite or NaN."""
    if -_ROUNDABLE < x < _ROUNDABLE:
        return (x + _ROUNDER) - _ROUNDER
    if x - x != 0.0:  # infinite (or NaN): rint leaves it as it is
        return x
    return float(round(x))


def round9(value: float) -> float:
    """``numpy.round(value, 9)`` for one float: ``rint(value × 10⁹) / 10⁹`` (a zero may lose its sign)."""
    return rint(value * 1e9) / 1e9


def search(values: list[float], x: float) -> int:
    """``bisect.bisect_left(values, x)`` for a sorted list of floats, as a loop (see :data:`COMPILED`)."""
    lo = 0
    hi = len(values)
    while lo < hi:
        mid = (lo + hi) >> 1
        if values[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


class OrderedQueue:
    """The queued processes of one queue order, kept sorted by their rank in that order.

    ``order`` is the full sort of every process of the flow (a permutation of ``range(n)``); the
    queue holds the ranks of the processes now queued in a sorted array of integers, so entering and
    starting cost a binary search and a move of the array's tail (C speed), reading the queue in order
    costs only its length, never the flow's, and numpy can read the ranks without a copy.
    """

    __slots__ = ("_order", "_process_at", "_rank_of", "ranks")

    def __init__(self, order: np.ndarray, tables: tuple[np.ndarray, list[int], list[int]] | None = None) -> None:
        """An empty queue in the order ``order``; ``tables``, if given, are another queue's of the same order."""
        if tables is None:
            fixed = np.array(order, dtype=np.int64)
            fixed.flags.writeable = False
            rank = np.empty(order.size, dtype=np.int64)
            rank[order] = np.arange(order.size)
            tables = (fixed, order.tolist(), rank.tolist())
        self._order: np.ndarray = tables[0]
        self._process_at: list[int] = tables[1]
        self._rank_of: list[int] = tables[2]
        self.ranks = array("q")

    def empty_copy(self) -> OrderedQueue:
        """A new, empty queue in the same order (sharing the order's tables, which never change)."""
        return OrderedQueue(self._order, (self._order, self._process_at, self._rank_of))

    def __reduce__(self) -> tuple[object, ...]:
        # Copied and pickled by its state (a compiled class has no __dict__ for the default to copy).
        return (_restored_queue, (self._order, self._process_at, self._rank_of, self.ranks))

    def __len__(self) -> int:
        return len(self.ranks)

    def rank(self, process: int) -> int:
        """The position of ``process`` in the order's full sort."""
        return self._rank_of[process]

    def add(self, process: int) -> None:
        """Queue ``process`` (it must not be queued already)."""
        insort(self.ranks, self._rank_of[process])

    def remove(self, process: int) -> None:
        """Take ``process`` out of the queue (it must be queued)."""
        ranks = self.ranks
        del ranks[bisect_left(ranks, self._rank_of[process])]

    def processes(self, limit: int | None = None) -> list[int]:
        """The queued processes in order, the first ``limit`` of them if given (a new list)."""
        at = self._process_at
        ranks = self.ranks if limit is None else self.ranks[:limit]
        return [at[r] for r in ranks]

    def processes_within(
        self, cpu: np.ndarray, memory: np.ndarray, cpu_limit: float, memory_limit: float, also: list[int]
    ) -> list[int]:
        """The queued processes, in order, asking at most the limits (within :data:`TOL`), and those in ``also``.

        A process is kept if ``cpu[p] - TOL <= cpu_limit`` and ``memory[p] - TOL <= memory_limit``;
        ``also`` lists queued processes to keep whatever they ask. One pass of whole-array
        operations over the queue, for long queues where a Python loop over it would cost more.
        """
        if not self.ranks:
            return []
        ranks = np.frombuffer(self.ranks, dtype=np.int64)  # a view: dropped before the queue changes
        processes = self._order[ranks]
        keep = (cpu[processes] - TOL <= cpu_limit) & (memory[processes] - TOL <= memory_limit)
        if also:
            rank_of = self._rank_of
            keep[np.searchsorted(ranks, [rank_of[p] for p in also])] = True
        del ranks
        return processes[keep].tolist()

    def least(self, cpu: np.ndarray, memory: np.ndarray) -> tuple[float, float]:
        """The least ``cpu`` and the least ``memory`` of the queued processes (the queue must not be empty)."""
        ranks = np.frombuffer(self.ranks, dtype=np.int64)  # a view: dropped before the queue changes
        processes = self._order[ranks]
        del ranks
        return float(cpu[processes].min()), float(memory[processes].min())

    def processes_before(self, rank: int) -> Iterator[int]:
        """The queued processes whose rank is below ``rank``, in order, as of this call (read lazily)."""
        ranks = self.ranks
        return map(self._process_at.__getitem__, ranks[: bisect_left(ranks, rank)])


class MachineIndex:
    """Free admitted CPU and free batch memory per machine, with the machines sorted by free CPU.

    Best fit picks, among the machines where both fit (within :data:`TOL`), the least CPU left over,
    then the least memory left over (both rounded to 9 decimals so float noise does not break genuine
    ties), then the lowest index. Sorted by free CPU, the machines left with the least CPU come first,
    so a search starts at the first machine with enough CPU and stops once the CPU left over grows.
    The order among machines with equal free CPU does not matter: ties are broken explicitly.
    """

    __slots__ = ("_machines", "_max_memory", "cpu", "keys", "memory")

    def __init__(self, cpu: list[float], memory: list[float]) -> None:
        self.cpu: list[float] = []
        self.memory: list[float] = []
        self.keys: list[float] = []  # free CPU, ascending (read, never written, outside)
        self._machines: list[int] = []  # the machine of each key
        self._max_memory: float | None = None
        self.rebuild(list(cpu), list(memory))

    def rebuild(
        self, cpu: list[float], memory: list[float], order: list[int] | None = None, keys: list[float] | None = None
    ) -> None:
        """Replace every machine's free CPU and memory (the index keeps the lists it is given).

        ``order``, if given, lists the machines sorted by ``cpu`` (in any order among equal values),
        and ``keys``, if given, their ``cpu`` in that order.
        """
        self.cpu = cpu
        self.memory = memory
        self._machines = sorted(range(len(cpu)), key=cpu.__getitem__) if order is None else order
        self.keys = [cpu[j] for j in self._machines] if keys is None else keys
        self._max_memory = None

    def __reduce__(self) -> tuple[object, ...]:
        # Copied and pickled by its state (a compiled class has no __dict__ for the default to copy).
        return (_restored_index, (self.cpu, self.memory, self._machines, self.keys, self._max_memory))

    def set(self, machine: int, cpu: float, memory: float) -> None:
        """Set one machine's free CPU and memory."""
        old_cpu = self.cpu[machine]
        if cpu != old_cpu:  # else its place in the order stays (and its value, were one zero's sign another)
            keys = self.keys
            machines = self._machines
            k = search(keys, old_cpu) if COMPILED else bisect_left(keys, old_cpu)
            while machines[k] != machine:
                k += 1
            if (k == 0 or keys[k - 1] <= cpu) and (k + 1 == len(keys) or cpu <= keys[k + 1]):
                keys[k] = cpu  # still in order where it is (about half the changes in a day's flow)
            else:
                del keys[k]
                del machines[k]
                k = search(keys, cpu) if COMPILED else bisect_left(keys, cpu)
                keys.insert(k, cpu)
                machines.insert(k, machine)
            self.cpu[machine] = cpu
        most = self._max_memory
        if most is not None:
            if memory > most:
                self._max_memory = memory
            elif memory < most and self.memory[machine] == most:
                self._max_memory = None  # the maximum may have gone: find it again when asked
        self.memory[machine] = memory

    def below(self, cpu: float) -> list[int]:
        """The machines with less than ``cpu`` free CPU (a new list, in no particular order)."""
        return self._machines[: search(self.keys, cpu) if COMPILED else bisect_left(self.keys, cpu)]

    @property
    def max_cpu(self) -> float:
        """The most free CPU on any machine."""
        return self.keys[-1]

    @property
    def max_memory(self) -> float:
        """The most free memory on any machine."""
        most = self._max_memory
        if most is None:
            most = self._max_memory = max(self.memory)
        return most

    def best_fit(self, cpu: float, memory: float) -> int:
        """The best-fit machine for a process asking ``cpu`` and ``memory``, or -1 if none fits."""
        keys = self.keys
        machines = self._machines
        free_memory = self.memory
        need_memory = memory - TOL
        k = search(keys, cpu - TOL) if COMPILED else bisect_left(keys, cpu - TOL)
        count = len(keys)
        while k < count:
            machine = machines[k]
            k += 1
            if free_memory[machine] >= need_memory:
                break
        else:
            return -1
        # round9 inline (in the interpreter a call costs more than the arithmetic).
        scaled = (keys[k - 1] - cpu) * 1e9
        cpu_left = ((scaled + _ROUNDER) - _ROUNDER if -_ROUNDABLE < scaled < _ROUNDABLE else rint(scaled)) / 1e9
        best = machine
        best_memory_left: float | None = None  # computed at the first tie
        # The CPU left over only grows along the keys; the machines that tie on it follow the first fit.
        while k < count:
            scaled = (keys[k] - cpu) * 1e9
            rounded = (scaled + _ROUNDER) - _ROUNDER if -_ROUNDABLE < scaled < _ROUNDABLE else rint(scaled)
            if rounded / 1e9 != cpu_left:
                break
            other = machines[k]
            k += 1
            if free_memory[other] >= need_memory:
                if best_memory_left is None:
                    best_memory_left = round9(free_memory[best] - memory)
                memory_left = round9(free_memory[other] - memory)
                if memory_left < best_memory_left or (memory_left == best_memory_left and other < best):
                    best_memory_left = memory_left
                    best = other
        return best


def _restored_queue(order: np.ndarray, process_at: list[int], rank_of: list[int], ranks: array[int]) -> OrderedQueue:
    """An :class:`OrderedQueue` from the state its ``__reduce__`` gives."""
    queue = OrderedQueue(order, (order, process_at, rank_of))
    queue.ranks = ranks
    return queue


def _restored_index(
    cpu: list[float], memory: list[float], machines: list[int], keys: list[float], max_memory: float | None
) -> MachineIndex:
    """A :class:`MachineIndex` from the state its ``__reduce__`` gives."""
    index = MachineIndex([], [])
    index.rebuild(cpu, memory, machines, keys)
    index._max_memory = max_memory
    return index
