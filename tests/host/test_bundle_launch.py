"""Bundles and the persistent launch (issue 41): the ring each kernel's persistent top was built for
is recorded in the (sealed, signable) manifest; emu opens each kernel's ring at that size and
refuses a device opened for another, naming both; bundles without the field keep loading at the
default ring; ``load(launch=)`` and ``Bundle.open`` put a bundle on a device in that mode.

emu persistent builds the test kind's loop with g++ (a few lines of C++, cached by source)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from _host_util import assert_same, sa
from offload.hls.registry import get_hls_kind, register_hls_kind
from offload.host import _manifest, open_device
from offload.host.emu import EmuDevice
from offload.host.bundle import DEFAULT_RING, BundleError, RingSize, load, save, sign
from offload.host.signing import generate_key
from offload.kernels.registry import get_kind, register_kind
from offload.sim.errors import InputError, OffloadError, UnsupportedError

# A kind without a ring capacity: a bundle of it has no persistent top.
NO_RING = "test_scale_add_no_ring"
try:
    get_kind(NO_RING)
except KeyError:
    register_kind(replace(get_kind(sa.KIND), name=NO_RING, spec_from_json=lambda d: sa.ScaleAddSpec(int(d["n"]), int(d["scale"]), kind=NO_RING)))
    register_hls_kind(replace(get_hls_kind(sa.KIND), name=NO_RING))


@pytest.fixture
def sim():
    d = open_device("sim")
    yield d
    d.close()


def _manifest_of(p) -> dict:
    return json.loads((p / "manifest.json").read_text())


def test_the_ring_is_recorded_sealed_and_signed(tmp_path):
    p = save([sa.make_kernel("a"), sa.make_kernel("b", n=4)], tmp_path / "b.offload", rings={"a": RingSize(2, 3)})
    m = _manifest_of(p)
    assert m["kernels"][0]["ring"] == {"slots": 2, "rows": 3} and "ring" not in m["kernels"][1]
    b = load(p)
    assert b.rings == {"a": RingSize(2, 3)} and b.ring("a") == RingSize(2, 3) and b.ring("b") == DEFAULT_RING == RingSize(8, 64)
    with pytest.raises(InputError, match=r"bundle 'b' has no kernel 'c'"):
        b.ring("c")
    # Re-saving a loaded bundle keeps its rings; signing covers them.
    q = save(b, tmp_path / "c.offload")
    priv, pub = generate_key(tmp_path / "k.pem")
    sign(q, priv)
    assert load(q, trusted_keys=[pub]).rings == {"a": RingSize(2, 3)}
    # An edited ring breaks the digest (and so the signature).
    m = _manifest_of(q)
    m["kernels"][0]["ring"]["slots"] = 4
    (q / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="manifest.json was edited after it was saved"):
        load(q)


def test_a_bundle_without_the_field_loads_at_the_default_ring(tmp_path):
    p = save([sa.make_kernel("a")], tmp_path / "b.offload")
    assert "ring" not in _manifest_of(p)["kernels"][0]
    b = load(p)
    assert b.rings == {} and b.ring("a") == DEFAULT_RING


@pytest.mark.parametrize("ring, field", [({"slots": 0, "rows": 1}, "slots"), ({"slots": 65537, "rows": 1}, "slots"),
                                         ({"slots": 1, "rows": 0}, "rows"), ({"slots": 1, "rows": 1, "x": 1}, "ring")])
def test_a_ring_off_its_schema_is_refused_naming_the_field(tmp_path, ring, field):
    p = save([sa.make_kernel("a")], tmp_path / "b.offload")
    m = _manifest_of(p)
    m["kernels"][0]["ring"] = ring
    m[_manifest.DIGEST_FIELD] = _manifest.digest(m)  # consistently resealed: the schema is what refuses it
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match=rf"kernels\[0\]\.ring"):
        load(p)
    # The same bounds at save, before anything is written.
    with pytest.raises(InputError, match=r"rings\['a'\]: expected a RingSize" if field == "ring" else f"ring {field}: "):
        save([sa.make_kernel("a")], tmp_path / "c.offload", rings={"a": ring})
    assert not (tmp_path / "c.offload").exists()


def test_the_edges_of_the_ring_bounds_are_accepted(tmp_path):
    p = save([sa.make_kernel("a")], tmp_path / "b.offload", rings={"a": {"slots": 65536, "rows": 1}})
    assert load(p).rings == {"a": RingSize(65536, 1)}
    with pytest.raises(InputError, match=r"ring rows: True is not an integer"):
        RingSize(1, True)
    with pytest.raises(InputError, match=r"save: rings: no kernel 'z' in the bundle"):
        save([sa.make_kernel("a")], tmp_path / "c.offload", rings={"z": RingSize(1, 1)})
    with pytest.raises(InputError, match=r"rings\['a'\]: expected a RingSize"):
        save([sa.make_kernel("a")], tmp_path / "c.offload", rings={"a": (1, 1)})


def test_emu_opens_each_kernel_at_its_recorded_ring(tmp_path, sim):
    ka, kb = sa.make_kernel("a", n=8, scale=3), sa.make_kernel("b", n=8, scale=5, seed=2)
    b = load(save([ka, kb], tmp_path / "b.offload", rings={"a": RingSize(2, 3)}))
    dev = open_device("emu", launch="persistent")
    h = dev.load_bundle(b)
    rings = dev.info().details["ring"]["kernels"]
    assert rings == {"a": {"slots": 2, "rows": 3}, "b": {"slots": 8, "rows": 64}}
    with pytest.raises(InputError, match=r"x: 32 elements exceed the ring slot's 24 \(3 rows a request\)"):
        dev.run(h["a"], sa.make_inputs(n=8, batch=4))
    hs = sim.load(ka)
    futs = [(dev.submit(h["a"], sa.make_inputs(n=8, batch=1 + i % 3, seed=i)), i) for i in range(9)]  # wraps the 2 slots
    for f, i in futs:
        assert_same(f.result(timeout=60), sim.run(hs, sa.make_inputs(n=8, batch=1 + i % 3, seed=i)))
    assert_same(dev.run(h["b"], sa.make_inputs(n=8, batch=5)), sim.run(sim.load(kb), sa.make_inputs(n=8, batch=5)))
    dev.close()


@pytest.mark.parametrize("opened, what, mine", [({"ring_slots": 4}, "ring_slots", 4), ({"ring_rows": 64}, "ring_rows", 64)])
def test_emu_opened_for_another_ring_refuses_the_bundle_naming_both(tmp_path, opened, what, mine):
    b = load(save([sa.make_kernel("a"), sa.make_kernel("b", n=4)], tmp_path / "b.offload", rings={"b": RingSize(2, 3)}))
    dev = EmuDevice("emu", "persistent", **opened)
    with pytest.raises(BundleError, match=rf"kernel 'b': its persistent top was built for a ring of 2 slots of 3 rows, "
                                          rf"and device 'emu' was opened with {what}={mine}") as e:
        dev.load_bundle(b)
    assert isinstance(e.value, ValueError) and isinstance(e.value, OffloadError)
    assert dev.info().details["kernels"] == []  # refused before the first kernel loaded
    dev.close()


def test_emu_opened_for_the_recorded_ring_or_an_unrecorded_bundle_loads(tmp_path, sim):
    k = sa.make_kernel("a", n=8)
    dev = EmuDevice("emu", "persistent", ring_slots=2, ring_rows=3)
    h = dev.load_bundle(load(save([k], tmp_path / "b.offload", rings={"a": RingSize(2, 3)})))
    h2 = dev.load_bundle(load(save([replace(k, name="u")], tmp_path / "u.offload")))  # no field: the device's ring
    assert dev.info().details["ring"]["kernels"] == {"a": {"slots": 2, "rows": 3}, "u": {"slots": 2, "rows": 3}}
    inp = sa.make_inputs(n=8, batch=3)
    assert_same(dev.run(h["a"], inp), sim.run(sim.load(k), inp))
    assert_same(dev.run(h2["u"], inp), sim.run(sim.load(k), inp))
    dev.close()


def test_load_with_launch_and_open(tmp_path, sim):
    k = sa.make_kernel("a", n=8, scale=7)
    p = save([k], tmp_path / "b.offload", rings={"a": RingSize(2, 4)})
    b = load(p, launch="persistent")
    assert b.launch == "persistent" and b.launch_why == ""
    dev, h = b.open("emu")
    try:
        assert dev.launch == "persistent" and dev.info().details["ring"]["kernels"] == {"a": {"slots": 2, "rows": 4}}
        inp = sa.make_inputs(n=8, batch=4)
        assert_same(dev.run(h["a"], inp), sim.run(sim.load(k), inp))
        assert dev.info().details["ring"]["requests"] == 1
    finally:
        dev.close()
    with pytest.raises(UnsupportedError, match="device 'sim': no 'persistent' launch mode"):
        b.open("sim")
    dev, _ = load(p, launch="auto").open("sim")  # auto: the device has no persistent mode
    assert dev.info().kind == "sim"
    dev.close()
    dev, _ = load(p).open("emu")  # no launch asked: per call, as before
    assert dev.launch == "per_call"
    dev.close()
    with pytest.raises(InputError, match=r"launch: 'sometimes' is not one of \['auto', 'per_call', 'persistent'\]"):
        load(p, launch="sometimes")
    with pytest.raises(InputError, match=r"launch: 'sometimes' is not one of"):
        b.open("emu", launch="sometimes")


def test_a_kind_without_a_ring_is_refused_persistent_and_runs_per_call_on_auto(tmp_path):
    k = sa.make_kernel("a", n=4)
    k = replace(k, spec=sa.ScaleAddSpec(4, 3, kind=NO_RING))
    p = save([k], tmp_path / "b.offload")
    with pytest.raises(UnsupportedError, match=rf"launch='persistent' is not possible: kernel 'a': the {NO_RING} kind has no ring"):
        load(p, launch="persistent")
    b = load(p, launch="auto")
    assert b.launch == "auto" and f"the {NO_RING} kind has no ring" in b.launch_why
    dev, h = b.open("emu")
    try:
        assert dev.launch == "per_call"
        x = np.arange(8, dtype=np.int32).reshape(2, 4)
        assert dev.run(h["a"], {"x": x})["y"].shape == (2, 4)
    finally:
        dev.close()
    with pytest.raises(UnsupportedError, match=f"bundle 'b': launch='persistent' is not possible: kernel 'a': the {NO_RING} kind"):
        b.open("emu", launch="persistent")
