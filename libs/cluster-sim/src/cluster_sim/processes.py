"""The process flow: machine topology, online-demand samples and batch-process arrivals."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "BatchProcess",
    "DemandSample",
    "Machine",
    "ProcessFlow",
    "synthetic_process_flow",
]


def _finite(value: float, what: str) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class Machine:
    """One machine of the cluster.

    Attributes:
        name: Unique machine name.
        cpu: CPU capacity, cores.
        memory: Memory capacity, in the flow's memory unit (GiB for the synthetic flow,
            percent of the largest machine for the Alibaba loader).
        online_memory: Memory reserved for online work on this machine, same unit; batch
            processes may use ``memory - online_memory``.
    """

    name: str
    cpu: float
    memory: float
    online_memory: float = 0.0

    def __post_init__(self) -> None:
        cpu = _finite(self.cpu, f"machine {self.name!r}: cpu")
        memory = _finite(self.memory, f"machine {self.name!r}: memory")
        online_memory = _finite(self.online_memory, f"machine {self.name!r}: online_memory")
        if cpu <= 0:
            raise ValueError(f"machine {self.name!r}: cpu must be positive, got {cpu}")
        if memory <= 0:
            raise ValueError(f"machine {self.name!r}: memory must be positive, got {memory}")
        if not 0 <= online_memory <= memory:
            raise ValueError(
                f"machine {self.name!r}: online_memory must lie in [0, memory={memory}], got {online_memory}"
            )
        object.__setattr__(self, "cpu", cpu)
        object.__setattr__(self, "memory", memory)
        object.__setattr__(self, "online_memory", online_memory)

    @property
    def batch_memory(self) -> float:
        """Memory available to batch processes (``memory - online_memory``)."""
        return self.memory - self.online_memory


@dataclass(frozen=True, slots=True)
class DemandSample:
    """Online CPU demand of every machine from ``time`` until the next sample.

    Attributes:
        time: Seconds from the start of the flow.
        cpu: Online CPU demand in cores, one value per machine in the flow's machine order.
    """

    time: float
    cpu: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "time", _finite(self.time, "demand sample time"))
        values = tuple(_finite(v, f"demand sample at t={self.time}: cpu value") for v in self.cpu)
        object.__setattr__(self, "cpu", values)


@dataclass(frozen=True, slots=True)
class BatchProcess:
    """One batch process: it enters the queue at ``release`` and needs ``cpu × duration`` core-seconds.

    Attributes:
        name: Unique process name.
        release: Seconds from the start of the flow at which the process enters the queue.
        cpu: CPU request, cores; the process never runs faster than this.
        memory: Memory held from start to completion, in the flow's memory unit.
        duration: Seconds the process needs when it gets its full CPU request.
        estimate: The duration estimate a scheduler sees, seconds (may differ from ``duration``).
    """

    name: str
    release: float
    cpu: float
    memory: float
    duration: float
    estimate: float | None = None

    def __post_init__(self) -> None:
        label = f"process {self.name!r}"
        object.__setattr__(self, "release", _finite(self.release, f"{label}: release"))
        object.__setattr__(self, "cpu", _finite(self.cpu, f"{label}: cpu"))
        object.__setattr__(self, "memory", _finite(self.memory, f"{label}: memory"))
        object.__setattr__(self, "duration", _finite(self.duration, f"{label}: duration"))
        estimate = self.duration if self.estimate is None else self.estimate
        object.__setattr__(self, "estimate", _finite(estimate, f"{label}: estimate"))

    @property
    def work(self) -> float:
        """Required work, core-seconds (``cpu × duration``)."""
        return self.cpu * self.duration


class _Derived(dict[str, object]):
    """A flow's cache of what simulators derive from it: a copy or a pickle of the flow starts it empty.

    What is cached is derived again, exactly, on first use; the compiled simulator's tables cannot be
    copied or pickled (mypyc's native classes), and need not be.
    """

    __slots__ = ()

    def __copy__(self) -> _Derived:
        return _Derived()

    def __deepcopy__(self, memo: dict[int, object]) -> _Derived:
        return _Derived()

    def __reduce__(self) -> tuple[type[_Derived], tuple[()]]:
        return (_Derived, ())


@dataclass(frozen=True, slots=True)
class ProcessFlow:
    """Everything that enters the cluster and when; immutable and validated on construction.

    Attributes:
        machines: The machines, in the order demand samples list their values.
        processes: Batch processes, in any order.
        demand: Online CPU demand samples, strictly increasing in time. Demand is zero
            before the first sample and holds each sample's value until the next.
        horizon: End of the flow, seconds; the simulation is truncated there.
        provenance: Free text saying where the flow came from.

    Raises:
        ValueError: If the flow cannot be simulated; the message names the offending item.
    """

    machines: tuple[Machine, ...]
    processes: tuple[BatchProcess, ...] = ()
    demand: tuple[DemandSample, ...] = ()
    horizon: float = 3600.0
    provenance: str = ""
    _by_name: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    # What simulators derive from the flow (arrays, sorted orders), kept so each new simulator of the
    # same flow (one per episode) need not derive it again; the flow is immutable, so it never goes stale.
    _derived: dict[str, object] = field(default_factory=lambda: _Derived(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "machines", tuple(self.machines))
        object.__setattr__(self, "processes", tuple(self.processes))
        object.__setattr__(self, "demand", tuple(self.demand))
        object.__setattr__(self, "horizon", _finite(self.horizon, "horizon"))
        self._validate()
        object.__setattr__(self, "_by_name", {p.name: i for i, p in enumerate(self.processes)})

    def _validate(self) -> None:
        if not self.machines:
            raise ValueError("a process flow needs at least one machine")
        if self.horizon <= 0:
            raise ValueError(f"horizon must be positive, got {self.horizon}")
        seen: set[str] = set()
        for machine in self.machines:
            if not isinstance(machine, Machine):
                raise TypeError(f"machines must be Machine objects, got {machine!r}")
            if machine.name in seen:
                raise ValueError(f"machine {machine.name!r} appears twice")
            seen.add(machine.name)
        self._validate_processes()
        self._validate_demand()

    def _validate_processes(self) -> None:
        cpu = np.array([m.cpu for m in self.machines])
        batch_memory = np.array([m.batch_memory for m in self.machines])
        seen: set[str] = set()
        for process in self.processes:
            if not isinstance(process, BatchProcess):
                raise TypeError(f"processes must be BatchProcess objects, got {process!r}")
            label = f"process {process.name!r}"
            if process.name in seen:
                raise ValueError(f"{label} appears twice")
            seen.add(process.name)
            if process.release < 0:
                raise ValueError(f"{label}: release must not be negative, got {process.release}")
            if process.cpu <= 0:
                raise ValueError(f"{label}: cpu must be positive, got {process.cpu}")
            if process.memory < 0:
                raise ValueError(f"{label}: memory must not be negative, got {process.memory}")
            if process.duration <= 0:
                raise ValueError(f"{label}: duration must be positive, got {process.duration}")
            if process.estimate is not None and process.estimate < 0:  # a float since __post_init__
                raise ValueError(f"{label}: estimate must not be negative, got {process.estimate}")
            if not np.any((cpu >= process.cpu) & (batch_memory >= process.memory)):
                raise ValueError(
                    f"{label} (cpu {process.cpu} cores, memory {process.memory}) is larger than every "
                    f"machine: the largest has {cpu.max()} cores and the most batch memory "
                    f"(memory - online_memory) is {batch_memory.max()}"
                )

    def _validate_demand(self) -> None:
        count = len(self.machines)
        previous: DemandSample | None = None
        for k, sample in enumerate(self.demand):
            if not isinstance(sample, DemandSample):
                raise TypeError(f"demand must hold DemandSample objects, got {sample!r}")
            label = f"demand sample {k} (t={sample.time})"
            if sample.time < 0:
                raise ValueError(f"{label}: time must not be negative")
            if previous is not None and sample.time <= previous.time:
                raise ValueError(
                    f"{label} is out of order: it does not come after sample {k - 1} (t={previous.time}); "
                    "demand samples must be strictly increasing in time"
                )
            if len(sample.cpu) > count:
                raise ValueError(
                    f"{label} gives {len(sample.cpu)} values, but the flow has {count} machine(s): "
                    f"machine index {count} does not exist"
                )
            if len(sample.cpu) < count:
                raise ValueError(
                    f"{label} gives {len(sample.cpu)} values for {count} machines: "
                    f"machine {self.machines[len(sample.cpu)].name!r} has no value"
                )
            for j, value in enumerate(sample.cpu):
                if value < 0:
                    raise ValueError(f"{label}: demand of machine {self.machines[j].name!r} is negative ({value})")
            previous = sample

    def process(self, name: str) -> BatchProcess:
        """The process called ``name``.

        Raises:
            KeyError: If the flow has no such process.
        """
        return self.processes[self.index_of(name)]

    def index_of(self, name: str) -> int:
        """Position of process ``name`` in :attr:`processes`.

        Raises:
            KeyError: If the flow has no such process.
        """
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"the flow has no process named {name!r}") from None


def synthetic_process_flow(
    seed: int | None = 0,
    *,
    machines: int = 8,
    processes: int | None = None,
    horizon: float = 6 * 3600.0,
    cpu: float = 32.0,
    memory: float = 128.0,
    online_memory: float = 32.0,
    demand_interval: float = 15.0,
    batch_load: float = 0.7,
    rng: np.random.Generator | None = None,
) -> ProcessFlow:
    """A random but reproducible flow with a daily online cycle and heavy-tailed batch work.

    Online demand per machine is a base level plus a 24-hour sinusoid plus AR(1) noise and rare
    spikes, sampled every ``demand_interval`` seconds. Batch processes arrive as a Poisson process
    whose rate follows the same cycle in antiphase; CPU requests come from {0.5, 1, 2, 4, 8} cores,
    durations are log-normal (median 5 minutes), and estimates are the duration times a
    log-normal error (sigma 0.5).

    Args:
        seed: Seed for ``numpy.random.default_rng``; ignored if ``rng`` is given.
        machines: Number of identical machines.
        processes: Number of batch processes; by default enough for ``batch_load`` of the capacity
            the online demand leaves free.
        horizon: Length of the flow, seconds.
        cpu: Cores per machine.
        memory: Memory per machine, GiB.
        online_memory: Memory reserved for online work per machine, GiB.
        demand_interval: Seconds between online demand samples.
        batch_load: Offered batch work as a fraction of the free capacity (when ``processes`` is None).
        rng: The random generator to draw from.

    Returns:
        The flow; its provenance records the arguments.
    """
    if rng is None:
        rng = np.random.default_rng(seed)
    if machines < 1:
        raise ValueError("machines must be at least 1")
    times = np.arange(0.0, horizon, demand_interval)
    phase = rng.uniform(0, 2 * np.pi)
    cycle = np.sin(2 * np.pi * times / 86_400.0 + phase)
    base = rng.uniform(0.25, 0.45, size=machines) * cpu
    amplitude = rng.uniform(0.08, 0.18, size=machines) * cpu
    noise = np.zeros((times.size, machines))
    shocks = rng.normal(0.0, 0.03 * cpu, size=(times.size, machines))
    for k in range(1, times.size):
        noise[k] = 0.9 * noise[k - 1] + shocks[k]
    spikes = (rng.random((times.size, machines)) < 0.004) * rng.uniform(0.1, 0.3, (times.size, machines)) * cpu
    level: np.ndarray = base[None, :] + amplitude[None, :] * cycle[:, None] + noise + spikes
    level = np.round(np.clip(level, 0.0, cpu), 2)
    demand = tuple(DemandSample(float(t), tuple(row.tolist())) for t, row in zip(times, level, strict=True))

    sizes = np.array([0.5, 1.0, 2.0, 4.0, 8.0])
    size_p = np.array([0.25, 0.35, 0.2, 0.15, 0.05])
    median_duration = 300.0
    if processes is None:
        mean_work = float(sizes @ size_p) * median_duration * np.exp(1.0**2 / 2)
        free = machines * cpu - float(level.mean(axis=0).sum())
        processes = max(1, int(batch_load * free * horizon / mean_work))
    # Arrival times: thinning of a Poisson process whose rate is high when online demand is low.
    weight = 1.0 - 0.5 * cycle
    release = np.sort(rng.choice(times, size=processes, p=weight / weight.sum()))
    release = np.round(release + rng.uniform(0.0, demand_interval, processes), 3)
    release = np.minimum(release, np.nextafter(horizon, 0))
    cpu_req = rng.choice(sizes, size=processes, p=size_p)
    duration = np.round(np.clip(rng.lognormal(np.log(median_duration), 1.0, processes), 10.0, 4 * 3600.0), 1)
    estimate = np.round(duration * rng.lognormal(0.0, 0.5, processes), 1)
    mem_req = np.round(np.minimum(cpu_req * rng.uniform(1.0, 6.0, processes), memory - online_memory), 2)
    batch = tuple(
        BatchProcess(f"p{i:05d}", float(r), float(c), float(m), float(d), float(e))
        for i, (r, c, m, d, e) in enumerate(zip(release, cpu_req, mem_req, duration, estimate, strict=True))
    )
    machine_list = tuple(Machine(f"m{j:03d}", cpu, memory, online_memory) for j in range(machines))
    provenance = (
        f"synthetic_process_flow(seed={seed}, machines={machines}, processes={processes}, horizon={horizon}, "
        f"cpu={cpu}, memory={memory}, online_memory={online_memory}, demand_interval={demand_interval}, "
        f"batch_load={batch_load})"
    )
    return ProcessFlow(machine_list, batch, demand, horizon, provenance)
