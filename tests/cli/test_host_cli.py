"""offload info and offload devices."""

from __future__ import annotations

import json
import sys

from click.testing import CliRunner

from _host_util import bundle_with_xclbin, fakes, sa  # noqa: F401
from offload.cli import main
from offload.host.bundle import save


def _kernels():
    return [sa.make_kernel("emb0", n=8, scale=3), sa.make_kernel("risk", n=4, scale=2)]


def test_info_table_and_json(tmp_path):
    p = save(_kernels(), tmp_path / "m.offload", meta={"model": "ranker-v3"})
    r = CliRunner().invoke(main, ["info", str(p)])
    assert r.exit_code == 0, r.output
    for words in ("emb0", "risk", "test_scale_add", "bias (8,) int32", "32 B", "model=ranker-v3", "no xclbin"):
        assert words in r.output, words
    r = CliRunner().invoke(main, ["info", str(p), "--json"])
    d = json.loads(r.output)
    assert [k["kernel"] for k in d["kernels"]] == ["emb0", "risk"]
    assert d["kernels"][1]["bytes"] == 16 and d["xclbin"] is None


def test_info_shows_formats_of_a_real_kernel(tmp_path):
    from offload.kernels.catalogue import entries

    k = entries("emb/sum/int8_rowwise/d16/bag20/t1")[0].build().kernel
    r = CliRunner().invoke(main, ["info", str(save([k], tmp_path / "e")), "--json"])
    (row,) = json.loads(r.output)["kernels"]
    assert row["kind"] == "embedding" and "int8_rowwise" in row["formats"]
    assert row["bytes"] == sum(v.nbytes for v in k.tensors.values())


def test_info_with_xclbin_and_refused_bundle(fakes, tmp_path):
    b = bundle_with_xclbin(tmp_path, _kernels(), cus=2)
    r = CliRunner().invoke(main, ["info", str(b.path), "--json"])
    x = json.loads(r.output)["xclbin"]
    assert x["uuid"] == b.xclbin_uuid and x["target"] == "u55c" and len(x["compute_units"]) == 2
    r = CliRunner().invoke(main, ["info", str(b.path)])
    assert "u55c" in r.output and b.xclbin_uuid in r.output
    f = next((b.path / "tensors").iterdir())
    f.write_bytes(f.read_bytes()[:-1])
    r = CliRunner().invoke(main, ["info", str(b.path)])
    assert r.exit_code == 1 and f.name in r.output and "truncated" in r.output


def _devices() -> dict:
    r = CliRunner().invoke(main, ["devices", "--json"])
    assert r.exit_code == 0, r.output
    return {d["backend"]: d for d in json.loads(r.output)}


def test_devices_without_xrt_or_pynq(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyxrt", None)
    monkeypatch.setitem(sys.modules, "pynq", None)
    d = _devices()
    assert d["sim"]["available"] and d["emu"]["available"]
    assert not d["xrt"]["available"] and "no pyxrt" in d["xrt"]["why"]
    assert not d["pynq"]["available"] and "offload[pynq]" in d["pynq"]["why"]
    r = CliRunner().invoke(main, ["devices"])
    assert r.exit_code == 0 and "offload[pynq]" in r.output


def test_devices_with_cards(fakes, monkeypatch):
    pyxrt, pynq = fakes
    monkeypatch.setattr(pyxrt, "__version__", "2.16.204", raising=False)
    d = _devices()
    assert d["xrt"]["available"] and d["xrt"]["devices"] == ["xrt:0 0000:3b:00.1 xilinx_u55c_gen3x16_xdma_base_3"]
    assert "XRT 2.16.204" in d["xrt"]["why"]
    assert d["pynq"]["available"] and d["pynq"]["devices"] == ["pynq:0 xilinx_u55c_gen3x16_xdma_base_3"]


def test_devices_explain_why_not(fakes, monkeypatch):
    pyxrt, pynq = fakes
    monkeypatch.setattr(pyxrt, "__version__", "2.17.319", raising=False)
    pyxrt.set_devices([])
    d = _devices()
    assert not d["xrt"]["available"] and "no card found" in d["xrt"]["why"]
    assert not d["pynq"]["available"] and "XRT 2.17.319 is too new for PYNQ 3.0 (it needs XRT 2.12 .. 2.16)" in d["pynq"]["why"]


def test_devices_asks_every_registered_backend(monkeypatch):
    """The command knows no backend: a new one's probe and launch modes show up, and a probe that
    breaks is reported against its own backend only."""
    import offload.host.device as device
    from offload.kernels.registry import Registry

    class Plain:
        launch_modes = ("per_call",)

        @classmethod
        def probe(cls):
            return device.Probe("plain", True, ("plain",), "needs nothing")

    class Card:
        launch_modes = ("per_call", "persistent")

        @classmethod
        def probe(cls):
            return device.Probe("card", True, ("card:0 slot 3",), "driver 1.2")

    class Broken:
        launch_modes = ("per_call",)

        @classmethod
        def probe(cls):
            raise OSError("driver gone")

    reg = Registry("device backend")
    for name, factory in (("plain", Plain), ("card", Card), ("broken", Broken)):
        reg.register(name, factory)
    monkeypatch.setattr(device, "DEVICES", reg)
    d = _devices()
    assert set(d) == {"plain", "card", "broken"}
    assert d["plain"]["available"] and d["plain"]["devices"] == ["plain"]
    assert d["card"] == {"backend": "card", "available": True, "devices": ["card:0 slot 3"], "why": "driver 1.2", "launch_modes": ["per_call", "persistent"]}
    assert not d["broken"]["available"] and "OSError: driver gone" in d["broken"]["why"]
