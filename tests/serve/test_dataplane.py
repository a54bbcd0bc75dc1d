"""The data plane on its own, without a protocol in front: what it passes to the batcher and the
runner, readiness, the model check, its answers against the sim device row by row, refusals as
:class:`InvalidRequest`, and the metrics it keeps for every request, answered or refused."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import offload
from offload import __version__
from offload.host import open_device
from offload.host.bundle import load
from offload.serve.config import ServeConfig
from offload.serve.dataplane import DataPlane
from offload.serve.errors import InvalidRequest, QueueFull, UnknownModel
from offload.serve.types import InferRequest


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A small MLP bundle, untrained (the plane never looks at what the weights mean)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    calib = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    path = tmp_path_factory.mktemp("plane") / "tiny"
    offload.save(offload.nn.MLP.from_float(model, calib=calib, precision="auto"), path, name="tiny")
    return load(path)


def _sample(metric, name: str, **labels) -> float:
    for fam in metric.collect():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_settings_reach_the_batcher_and_the_runner_in_their_units(bundle):
    cfg = ServeConfig(device="sim", max_batch_size=8, max_queue_delay_us=250, max_queue_size=3,
                      request_timeout_ms=1500.0, device_timeout_ms=700.0)
    p = DataPlane(bundle, cfg)
    assert p.batcher.max_batch_size == 8 and p.batcher.max_queue_size == 3
    assert p.batcher.max_queue_delay_s == pytest.approx(250e-6, rel=0, abs=1e-15)
    assert p.runner.timeout_s == pytest.approx(0.7, rel=0, abs=1e-15)
    assert p.launch == "per_call"  # auto on sim: sim offers no persistent launch
    assert _sample(p.metrics.fallbacks, "offload_fallbacks_total", model=p.model.name) == 0.0
    assert any(s.labels.get("model") == p.model.name for fam in p.metrics.fallbacks.collect() for s in fam.samples)
    p.runner.close()


def test_readiness_follows_start_drain_and_the_primary(bundle):
    async def go():
        p = DataPlane(bundle, ServeConfig(device="sim", fallback="503"))
        assert not p.ready()
        await p.start()
        assert p.ready()
        p.runner.state = "down"
        assert not p.ready()  # no fall-back: a down primary is not ready
        p.runner.state = "up"
        p.draining = True
        assert not p.ready()
        await p.stop()
        q = DataPlane(bundle, ServeConfig(device="sim", fallback="sim"))
        await q.start()
        q.runner.state = "down"
        assert q.ready()  # the sim fall-back answers for it
        await q.stop()

    asyncio.run(go())


def test_the_model_check_names_model_and_version(bundle):
    p = DataPlane(bundle, ServeConfig(device="sim"))
    name, version = p.model.name, p.model.version
    p.check_model(name, None)
    p.check_model(name, "")
    p.check_model(name, version)
    for other in ("a", name[:-1], name + "a", "zzz"):  # names sorting before and after the model's
        with pytest.raises(UnknownModel, match=f"unknown model {other!r}; this server serves {name!r}"):
            p.check_model(other, None)
    for other in ("0", version + "0", "999"):
        with pytest.raises(UnknownModel, match=f"has no version {other!r}"):
            p.check_model(name, other)
    assert p.server_metadata() == {"name": "offload", "version": __version__, "extensions": ["binary_tensor_data"]}
    p.runner.close()


def test_infer_answers_each_request_with_the_sim_devices_rows_and_counts_every_request(bundle):
    width = DataPlane(bundle, ServeConfig(device="sim")).model.input.width
    x = np.random.default_rng(3).normal(size=(3, width)).astype(np.float32)
    dev = open_device("sim")
    h = dev.load(next(iter(bundle.kernels.values())))
    want = np.concatenate([dev.run(h, {"x": x[i : i + 1].astype(np.float64)})["y"] for i in range(3)]).astype(np.float32)
    dev.close()

    async def go():
        p = DataPlane(bundle, ServeConfig(device="sim"))
        await p.start()
        t0 = time.perf_counter()
        r = await p.infer(InferRequest(x, id="k", binary_output=True))
        assert (r.model, r.version, r.output, r.id, r.binary_output) == (p.model.name, p.model.version, p.model.output, "k", True)
        np.testing.assert_array_equal(np.asarray(r.y, dtype=np.float32), want)
        with pytest.raises(InvalidRequest, match=r"^inputs\[0\].data: "):
            await p.infer(InferRequest(np.full((1, width), np.nan, dtype=np.float32)))
        n = _sample(p.metrics.request_duration, "offload_request_duration_seconds_count", model=p.model.name)
        assert n == 2  # the refused request's time is observed too
        took = _sample(p.metrics.request_duration, "offload_request_duration_seconds_sum", model=p.model.name)
        assert 0 < took <= time.perf_counter() - t0  # seconds each request took, no more
        assert p.failed(QueueFull("full")) == 503 and p.failed(InvalidRequest("bad")) == 400
        assert _sample(p.metrics.errors, "offload_errors_total", type="bad_request") == 1
        await p.stop()

    asyncio.run(go())


def test_the_request_timeout_reaches_the_batcher_in_seconds(bundle, monkeypatch):
    seen = []

    async def infer(rows, timeout):
        seen.append(timeout)
        return np.zeros((len(rows), 1), np.float32)

    async def go():
        p = DataPlane(bundle, ServeConfig(device="sim", request_timeout_ms=1500.0))
        monkeypatch.setattr(p.batcher, "infer", infer)
        await p.infer(InferRequest(np.zeros((1, p.model.input.width), np.float32)))
        p.runner.close()

    asyncio.run(go())
    assert seen == [1.5]


def test_the_plane_logs_the_manifest_digest_of_the_bundle_it_serves(bundle, caplog, tmp_path):
    """The audit trail names the bundle that went live: its manifest digest, or that it is unsealed."""
    import json
    import logging
    import shutil
    import warnings

    def logged(b) -> str:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="offload.serve"):
            DataPlane(b, ServeConfig(device="sim")).runner.close()
        return " ".join(r.getMessage() for r in caplog.records if r.name == "offload.serve")

    digest = json.loads((bundle.path / "manifest.json").read_text())["manifest_sha256"]
    assert f"bundle manifest sha256 {digest}" in logged(bundle)
    v1 = tmp_path / "v1"
    shutil.copytree(bundle.path, v1)
    m = json.loads((v1 / "manifest.json").read_text())
    del m["manifest_sha256"]
    m["version"] = 1
    (v1 / "manifest.json").write_text(json.dumps(m))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unsealed = load(v1)
    msg = logged(unsealed)
    assert "unsealed v1 bundle" in msg and digest not in msg, msg
