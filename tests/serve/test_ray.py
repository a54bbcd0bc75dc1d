"""Scale-out: the service as two Ray Serve replicas on a local Ray instance."""

from __future__ import annotations

import socket

import numpy as np
import pytest

import _serve_standin as standin
from offload.serve.ray_serve import replica_device

pytestmark = [pytest.mark.ray]


def test_replica_device_choice():
    assert replica_device("xrt:0", {"fpga": 1.0, "CPU": 0.5}, "fpga") == "xrt:0"
    assert replica_device("xrt:0", {"CPU": 0.5}, "fpga") == "sim"
    assert replica_device("xrt:0", {"card": 1.0}, "fpga") == "sim"


@pytest.mark.slow
def test_two_replicas_on_local_ray(tmp_path):
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    httpx = pytest.importorskip("httpx")
    from offload.host import open_device
    from offload.host.bundle import load
    from offload.serve.config import ServeConfig
    from offload.serve.ray_serve import APP_NAME, deploy

    bundle = standin.risk_bundle_path()
    # Two units of the card resource: both replicas must claim one each. The "card" device is
    # the sim device here (no card on CI), so the replica opens what it was configured with.
    ray.init(num_cpus=2, resources={"fpga": 2}, include_dashboard=False, logging_level="error", configure_logging=False)
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        info = deploy(bundle, ServeConfig(device="sim"), replicas=2, resource="fpga", port=port)
        assert info["cards"]
        assert ray.available_resources().get("fpga", 0) == 0, "replicas did not claim the card resource"
        st = serve.status().applications[APP_NAME]
        assert st.status == "RUNNING"
        (dep,) = st.deployments.values()
        assert dep.replica_states.get("RUNNING") == 2
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/v2/health/ready", timeout=10).status_code == 200
        x = np.random.default_rng(2).normal(size=(6, 16)).astype(np.float32)
        dev = open_device("sim")
        want = dev.run(dev.load(next(iter(load(bundle).kernels.values()))), {"x": x.astype(np.float64)})["y"].astype(np.float32)
        with httpx.Client(base_url=url, timeout=30) as c:
            for i in range(6):  # several requests: the proxy spreads them over both replicas
                body = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": x[i].tolist()}]}
                r = c.post("/v2/models/risk/infer", json=body)
                assert r.status_code == 200, r.text
                assert np.float32(r.json()["outputs"][0]["data"][0]) == want[i, 0]
    finally:
        serve.shutdown()
        ray.shutdown()
