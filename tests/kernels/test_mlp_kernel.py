"""The mlp Vitis kernel (hls4ml firmware + generated top) compiled with g++, against the simulator.

A private ctypes harness calls the top function exactly as the emu device does (pointer
buffers in ``top_args`` order, the batch size by value); then the emu and sim devices run the
same kernel through the device protocol. Zero mismatches on random and adversarial rows.
"""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

from mlp_cases import adversarial_inputs, random_spec
from offload.hls import csim
from offload.hls.registry import get_hls_kind
from offload.host import open_device
from offload.kernels import Kernel, get_kind
from offload.kernels.mlp import MlpSpec
from offload.sim.errors import InputError, InputKeyError, InputTypeError, OffloadError
from offload.sim.mlp import simulate

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def case():
    spec, _ = random_spec(5)
    return spec


def _ctypes_top(spec):
    hk = get_hls_kind("mlp")
    lib = csim.load_library(csim.build(hk.sources(spec), shared=True))
    fn = getattr(lib, hk.top_name(spec))
    fn.argtypes = [ctypes.c_void_p if a.role != "scalar" else ctypes.c_int32 for a in hk.top_args(spec)]
    fn.restype = None
    return hk, fn


def test_generated_sources_are_hls4ml_firmware_plus_a_vitis_top(case):
    hk = get_hls_kind("mlp")
    srcs = hk.sources(case)
    top = srcs[f"{hk.top_name(case)}.cpp"]
    for pragma in ("m_axi port = x", "m_axi port = y", "s_axilite port = n", "s_axilite port = return", "PIPELINE II = 1"):
        assert pragma in top
    assert "parameters.h" in srcs and "defines.h" in srcs
    assert not any("load_weights_from_txt" in s for s in srcs.values())  # weights are constants
    assert not any('#include "weights/' in s for s in srcs.values())  # flat source set
    assert [a.role for a in hk.top_args(case)] == ["input", "output", "scalar"]
    assert hk.pack_resident(case, case.tensors()) == {}


def test_kernel_csim_matches_simulator_through_ctypes(case):
    hk, fn = _ctypes_top(case)
    rng = np.random.default_rng(7)
    x = adversarial_inputs(rng, 20000, case.n_features, case.input_type)
    bufs = hk.pack_inputs(case, {"x": x})
    fn(bufs["x"].ctypes.data, bufs["y"].ctypes.data, int(bufs["n"]))
    y = hk.unpack_outputs(case, {"x": x}, bufs)["y"]
    want = simulate(case.input_type, case.layers, case.tensors(), x)
    assert y.shape == want.shape
    assert int((y != want).sum()) == 0
    # n = 0 writes nothing
    empty = hk.pack_inputs(case, {"x": np.zeros((0, case.n_features))})
    fn(empty["x"].ctypes.data, empty["y"].ctypes.data, 0)


def test_emu_and_sim_devices_agree_and_spec_round_trips_json(case):
    spec = MlpSpec.from_json(json.loads(json.dumps(case.to_json())))
    assert spec == case
    kernel = Kernel("risk", spec, spec.tensors())
    rng = np.random.default_rng(8)
    x = adversarial_inputs(rng, 3000, spec.n_features, spec.input_type)
    sim = open_device("sim")
    emu = open_device("emu")
    try:
        y_sim = sim.run(sim.load(kernel), {"x": x})["y"]
        y_emu = emu.run(emu.load(kernel), {"x": x})["y"]
    finally:
        sim.close()
        emu.close()
    assert int((y_sim != y_emu).sum()) == 0
    assert np.array_equal(y_sim, get_kind("mlp").reference(spec, kernel.tensors, {"x": x})["y"])


def test_bad_input_is_rejected_before_device_work(case):
    kind = get_kind("mlp")
    t = case.tensors()
    x = np.zeros((4, case.n_features))
    x[2, 1] = np.nan
    # Each refusal is the hierarchy's type (one OffloadError base, what the service maps to 400)
    # and still the builtin callers caught before.
    with pytest.raises(InputError, match="row 2 column 1"):
        kind.validate(case, t, {"x": x})
    x[2, 1] = np.inf
    with pytest.raises(InputError, match="row 2 column 1"):
        kind.validate(case, t, {"x": x})
    with pytest.raises(InputError, match=rf"\[batch, {case.n_features}\]"):
        kind.validate(case, t, {"x": np.zeros((3, case.n_features + 1))})
    with pytest.raises(InputTypeError, match="floating point") as ei:
        kind.validate(case, t, {"x": np.zeros((3, case.n_features), dtype=np.int64)})
    assert isinstance(ei.value, TypeError) and isinstance(ei.value, OffloadError)
    with pytest.raises(InputKeyError, match="'x'") as ei:
        kind.validate(case, t, {"features": x})
    assert isinstance(ei.value, KeyError) and isinstance(ei.value, OffloadError)


def test_spec_validation_names_the_field():
    spec, _ = random_spec(5)
    d = spec.to_json()
    d["layers"][0]["n_in"] += 1
    with pytest.raises(ValueError, match="n_in"):
        MlpSpec.from_json(d)
    d = spec.to_json()
    d["layers"][-1]["result"] = "ap_fixed<70,10>"
    with pytest.raises(ValueError, match="result type"):
        MlpSpec.from_json(d)
    d = spec.to_json()
    first = next(iter(d["constants"]))
    d["constants"][first] = d["constants"][first][:-1]
    with pytest.raises(ValueError, match=first):
        MlpSpec.from_json(d)


@pytest.mark.parametrize("device", ["sim", "emu"])
def test_resident_weights_must_equal_the_compiled_constants(case, device):
    # The C++ kernel has the spec's constants compiled in; the reference reads the tensors. A kernel
    # whose tensors differ would give different answers per device, so load refuses it.
    dev = open_device(device)
    good = case.tensors()
    dev.load(Kernel("m", case, good))
    name = sorted(good)[0]
    changed = {k: v.copy() for k, v in good.items()}
    changed[name].flat[0] += 1
    with pytest.raises(ValueError, match=f"{name!r} differs from the spec's constants"):
        dev.load(Kernel("m", case, changed))
    with pytest.raises(ValueError, match="must be exactly"):
        dev.load(Kernel("m", case, {k: v for k, v in good.items() if k != name}))
    with pytest.raises(TypeError, match="raw integers"):
        dev.load(Kernel("m", case, {**good, name: good[name].astype(np.float64)}))
    dev.close()
