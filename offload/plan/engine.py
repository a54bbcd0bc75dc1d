"""Where a sharded collection's cards run: ``"local"`` (one device per card in this process,
called concurrently from a thread each) or ``"ray"`` (one Ray actor per card, each holding only
its own shards' kernels, placed by custom resources such as ``{"alveo_u55c": 1}`` in a placement
group with one bundle per host, spread over nodes).

An engine loads ``{card: [Kernel, ...]}`` once and then runs ``{card: [inputs, ...]}`` per batch,
returning ``{card: [outputs, ...]}`` in the same order.

Example::

    eng = open_engine("local", plan.topology, device="sim")
    eng.load({(0, 0): [k0], (0, 1): [k1]})
    outs = eng.run({(0, 0): [inputs0], (0, 1): [inputs1]})
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from offload.host import open_device
from offload.kernels import Kernel
from offload.kernels.registry import Registry
from offload.plan.topology import Topology
from offload.sim.errors import DeviceError, InputError

__all__ = ["ENGINES", "open_engine", "LocalEngine", "RayEngine", "card_resource"]

Card = tuple[int, int]
ENGINES: Registry[Callable[..., Any]] = Registry("sharded-execution engine")


def card_resource(card_name: str) -> str:
    """The Ray custom resource a node advertises per card of this type: ``alveo_<card>``."""
    return f"alveo_{card_name}"


def open_engine(name: str, topology: Topology, **kw: Any):
    """An engine by name (``"local"``, ``"ray"``) for ``topology``."""
    if name not in ENGINES:
        raise InputError(f"engine {name!r}: unknown; known: {ENGINES.names()}")
    return ENGINES.get(name)(topology, **kw)


class _CardWorker:
    """One card: its device and the kernels loaded on it (also the body of a Ray actor)."""

    def __init__(self, device: str) -> None:
        self.device = open_device(device)
        self.handles: list = []

    def load(self, kernels: Sequence[Kernel]) -> int:
        self.handles = [self.device.load(k) for k in kernels]
        return len(self.handles)

    def run(self, inputs: Sequence[Mapping[str, Any]]) -> list[dict]:
        return [self.device.run(h, x) for h, x in zip(self.handles, inputs)]

    def close(self) -> None:
        self.device.close()


@ENGINES.register("local")
class LocalEngine:
    """One device per card in this process; a batch calls every card concurrently."""

    def __init__(self, topology: Topology, device: str = "sim") -> None:
        self.topology = topology
        self.device = device
        self.workers: dict[Card, _CardWorker] = {}
        self._pool: ThreadPoolExecutor | None = None

    def load(self, kernels: Mapping[Card, Sequence[Kernel]]) -> None:
        if self._pool is not None:
            raise DeviceError("engine 'local': already loaded; close it before loading other kernels")
        for card, ks in kernels.items():
            self.topology.card(*card)
            w = self.workers[card] = _CardWorker(self.device)
            w.load(list(ks))
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.workers)), thread_name_prefix="offload-card")

    def run(self, calls: Mapping[Card, Sequence[Mapping[str, Any]]]) -> dict[Card, list[dict]]:
        if self._pool is None:
            raise DeviceError("engine 'local': nothing loaded; call load() first")
        futs = {card: self._pool.submit(self.workers[card].run, xs) for card, xs in calls.items()}
        return {card: f.result() for card, f in futs.items()}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for w in self.workers.values():
            w.close()
        self.workers.clear()


@ENGINES.register("ray")
class RayEngine:
    """One Ray actor per card. Each plan host is one bundle of a placement group (strategy
    ``STRICT_SPREAD``: hosts on distinct nodes) holding that host's cards as custom resources
    (``alveo_<card>``); a card's actor takes one unit of its host's bundle and loads only its
    own kernels. Ray must be initialised (``ray.init``) by the caller."""

    def __init__(self, topology: Topology, device: str = "sim", strategy: str = "STRICT_SPREAD", timeout_s: float = 120.0) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            raise DeviceError("engine 'ray': ray is not initialised; call ray.init(address=...) first")
        self._ray = ray
        self.topology = topology
        self.device = device
        bundles = []
        for cards in topology.hosts:
            b: dict[str, float] = {}
            for c in cards:
                b[card_resource(c.name)] = b.get(card_resource(c.name), 0) + 1
            bundles.append(b)
        self.pg = placement_group(bundles, strategy=strategy)
        if not self.pg.wait(timeout_s):
            ray.util.remove_placement_group(self.pg)
            raise DeviceError(f"engine 'ray': no placement for {bundles} ({strategy}) within {timeout_s} s; "
                              f"each host needs a node advertising its cards' resources")
        self._actor_cls = ray.remote(num_cpus=0)(_CardWorker)
        self._strategy = PlacementGroupSchedulingStrategy
        self.actors: dict[Card, Any] = {}

    def load(self, kernels: Mapping[Card, Sequence[Kernel]]) -> None:
        pending = []
        for (h, c), ks in kernels.items():
            card = self.topology.card(h, c)
            a = self._actor_cls.options(resources={card_resource(card.name): 1},
                                        scheduling_strategy=self._strategy(placement_group=self.pg, placement_group_bundle_index=h)
                                        ).remote(self.device)
            self.actors[(h, c)] = a
            pending.append(a.load.remote(list(ks)))
        self._ray.get(pending)

    def run(self, calls: Mapping[Card, Sequence[Mapping[str, Any]]]) -> dict[Card, list[dict]]:
        refs = {card: self.actors[card].run.remote(list(xs)) for card, xs in calls.items()}
        got = self._ray.get(list(refs.values()))
        return dict(zip(refs, got))

    def close(self) -> None:
        for a in self.actors.values():
            self._ray.kill(a)
        self.actors.clear()
        self._ray.util.remove_placement_group(self.pg)
