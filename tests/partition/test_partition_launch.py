"""``offload.offload(..., launch=)``: the device it opens runs the offloaded kernels in that launch
mode, the report says which mode each offloaded unit runs in (and why not persistent where
``"auto"`` could not be), and a Device object with ``launch=`` is refused.

emu persistent compiles the persistent top of one small table with g++ (cached by source hash)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import offload
from offload.host import open_device
from offload.host.device import KernelHandle
from offload.sim.errors import InputError, InputTypeError, OffloadError, UnsupportedError


class OneBag(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.bag = nn.EmbeddingBag(30, 4, mode="sum")

    def forward(self, idx, off):
        return self.bag(idx, off) * 2.0


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 30, (12,), generator=g)
    return idx, torch.tensor([0, 3, 3, 7, 12])[:4]  # an empty bag, a last bag of five ids


def _device_of(gm, d):
    return gm.get_submodule(d.replacement)._res.device  # white box: the device the unit's kernel is resident on


@pytest.fixture(scope="module")
def want():
    model = OneBag().eval()
    sim = offload.offload(model, _inputs(0), ops=("embedding_bag",), device="sim")
    return model, sim


@pytest.mark.parametrize("launch", ["persistent", "auto"])
def test_emu_persistent_runs_through_the_ring_and_equals_sim(want, launch):
    model, sim = want
    gm = offload.offload(model, _inputs(0), ops=("embedding_bag",), device="emu", launch=launch)
    (d,) = gm.offload_report.offloaded
    assert d.launch == "persistent" and not gm.offload_report.notes
    assert f"offload ({d.replacement}, persistent)" in str(gm.offload_report)
    dev = _device_of(gm, d)
    assert dev.launch == "persistent"
    for seed in (1, 2, 3):
        torch.testing.assert_close(gm(*_inputs(seed)), sim(*_inputs(seed)), rtol=0, atol=0)
    assert dev.info().details["ring"]["requests"] == 3  # every call went through the ring
    dev.close()


def test_per_call_and_the_default_keep_todays_device(want):
    model, _ = want
    for launch in (None, "per_call"):
        gm = offload.offload(model, _inputs(0), ops=("embedding_bag",), device="sim", launch=launch)
        (d,) = gm.offload_report.offloaded
        assert d.launch == "per_call" and not gm.offload_report.notes
        assert _device_of(gm, d) is offload.host.default_device("sim")  # the process's shared device, as before


def test_auto_where_persistence_is_not_possible_runs_per_call_and_says_why(want):
    model, sim = want
    gm = offload.offload(model, _inputs(0), ops=("embedding_bag",), device="sim", launch="auto")
    (d,) = gm.offload_report.offloaded
    assert d.launch == "per_call"
    (note,) = gm.offload_report.notes
    assert "persistent is not possible on device 'sim'" in note and "no kernel to keep running" in note
    torch.testing.assert_close(gm(*_inputs(4)), sim(*_inputs(4)), rtol=0, atol=0)


def test_an_open_device_keeps_its_own_launch_mode(want):
    model, _ = want
    dev = open_device("emu", launch="persistent")
    gm = offload.offload(model, _inputs(0), ops=("embedding_bag",), device=dev)
    (d,) = gm.offload_report.offloaded
    assert d.launch == "persistent" and _device_of(gm, d) is dev
    dev.close()


def test_bad_launch_arguments_are_typed_errors(want):
    model, _ = want
    dev = open_device("sim")
    with pytest.raises(InputTypeError, match=r"launch='per_call' with device='sim', an open device") as e:
        offload.offload(model, _inputs(0), device=dev, launch="per_call")
    assert isinstance(e.value, TypeError) and isinstance(e.value, OffloadError)
    with pytest.raises(InputError, match=r"launch: 'sometimes' is not one of \['auto', 'per_call', 'persistent'\]"):
        offload.offload(model, _inputs(0), device="sim", launch="sometimes")
    with pytest.raises(UnsupportedError, match="device 'sim': no 'persistent' launch mode"):
        offload.offload(model, _inputs(0), device="sim", launch="persistent")


class Untraceable(OneBag):
    def forward(self, idx, off):
        out = self.bag(idx, off)
        return out * 2.0 if out.sum() > 0 else out  # data-dependent control flow: fx cannot trace it


@pytest.mark.parametrize("fail", ["untraceable", "a later pass"])
def test_the_device_opened_for_the_call_is_closed_when_it_is_not_used(monkeypatch, fail):
    import offload.partition.state as state
    from offload.partition import calibrate

    opened = []

    def recording_open(spec, **kw):
        dev = open_device(spec, **kw)
        opened.append(dev)
        return dev

    monkeypatch.setattr(state, "open_device", recording_open)
    if fail == "untraceable":
        gm = offload.offload(Untraceable().eval(), _inputs(0), ops=("embedding_bag",), device="emu", launch="persistent")
        assert not gm.offload_report.traced
    else:
        def boom(st):
            raise RuntimeError("a pass failed")

        monkeypatch.setattr(calibrate, "apply", boom)
        with pytest.raises(RuntimeError, match="a pass failed"):
            offload.offload(OneBag().eval(), _inputs(0), ops=("embedding_bag",), device="emu", launch="persistent")
    (dev,) = opened
    with pytest.raises(OffloadError, match=f"device {dev.name!r} is closed"):  # refused before the handle is read
        dev.submit(KernelHandle(dev.name, "bag", "embedding", 0), {})
