"""``muster run cluster``'s Faust app: the effects side of the link (``shared.kubernetes.cluster``) in
this process, the watching process (``shared.kubernetes.cluster_watch``) started beside it.

Apart from both so that neither imports the other: the watching process needs the bridge, and the
app needs both."""

from __future__ import annotations

from typing import Any

from shared.kubernetes.cluster import ClusterBridge, EffectsReader, KubeTarget
from shared.kubernetes.cluster_watch import WatchProcess
from shared.runtime.bus import stagetrace
from shared.runtime.bus.app import FaustProducer, MusterApp, base_app
from shared.runtime.bus.config import BusConfig


class ClusterApp(MusterApp):
    """``muster run cluster``'s app: Faust runs the process and the producer, ``EffectsReader`` the
    effects (Faust's own consumer is not started)."""

    producer_only = True
    muster_effects: EffectsReader | None = None

    async def on_stop(self) -> None:
        if self.muster_effects is not None:
            await self.muster_effects.stop()  # before the producer its dead letters go out with stops
        await super().on_stop()


def cluster_app(config: BusConfig, target: KubeTarget, *, sink: Any = None, loglevel: str = "info") -> MusterApp:
    """The app behind ``muster run cluster`` (which takes the Lease first: ``take_lease``); with a
    ``sink`` (tracing on) each effect applied is a span; ``loglevel`` is the watching process's."""
    app = base_app(f"{config.prefix}cluster", config, cls=ClusterApp)
    stagetrace.start("cluster")
    bridge = ClusterBridge(config.topics)
    if sink is not None:
        from shared.observability.tracing.live import HopTracer

        bridge.tracer = HopTracer("cluster", sink, topic=config.topics.effects, group=f"{config.prefix}cluster")
    app.muster_bridge = bridge  # type: ignore[attr-defined]
    producer = FaustProducer(app)
    effects = EffectsReader(config, bridge, producer)
    app.muster_effects = effects  # type: ignore[attr-defined]

    async def apply_effects_once() -> None:
        api = await target.connect()
        bridge.connect(api)
        try:
            await effects.run()
        finally:
            await api.close()

    @app.task
    async def apply_effects() -> None:
        await bridge.supervised("applying effects", apply_effects_once)

    watcher = WatchProcess(config, target, bridge, loglevel=loglevel)
    app.muster_watcher = watcher  # type: ignore[attr-defined]

    @app.task
    async def watch_and_publish() -> None:  # in a process of its own: shared.kubernetes.cluster_watch
        await bridge.supervised("watching and publishing", watcher.run)

    return app
