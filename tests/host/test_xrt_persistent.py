"""The xrt device's persistent launch mode through the pyxrt stand-in, for every XRT profile offload
supports: the loop offload.hls.persistent writes runs in a thread over the ring's "device memory"
(tests/fakes/pyxrt.py), the host follows offload.kernels.ring's contract over XRT buffers, and
every answer is checked against the sim device on the same inputs."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from _host_util import assert_same, fakes, install_fakes, pynq_fakes, sa  # noqa: F401

from offload.hls import persistent
from offload.hls.registry import get_hls_kind, register_hls_kind
from offload.host import DeviceError, DeviceTimeout, open_device
from offload.kernels.registry import get_kind, register_kind
from offload.kernels.ring import RING_CAPACITY, register_capacity
from offload.sim.errors import BundleError, InputError, UnsupportedError

# The private test kind with a ring capacity, under its own name, so that the kinds other tests
# build projects from keep theirs (none): a slot holds `rows` rows of x and y.
RING_KIND = "test_scale_add_ring"
if RING_KIND not in RING_CAPACITY:
    _k, _hk = get_kind(sa.KIND), get_hls_kind(sa.KIND)
    register_kind(replace(_k, name=RING_KIND, spec_from_json=lambda d: sa.ScaleAddSpec(int(d["n"]), int(d["scale"]), kind=RING_KIND)))
    register_hls_kind(replace(_hk, name=RING_KIND))
    register_capacity(RING_KIND, lambda spec, rows: {"x": rows * spec.n, "y": rows * spec.n})


def _kernel(name="sa", n=8, scale=3, seed=0):
    k = sa.make_kernel(name, n=n, scale=scale, seed=seed)
    return replace(k, spec=sa.ScaleAddSpec(n, scale, kind=RING_KIND))

PLATFORM = "xilinx_u55c_gen3x16_xdma_3_202210_1"


def _bundle(tmp_path, kernels, *, ring_memory="HOST", per_call=True, ring=True, ring_cus=1, built=None, recorded=None):
    """A saved bundle whose (fake) xclbin holds each kernel's per-call top and/or its persistent top,
    the ring port at HOST[0] (``ring_memory="HOST"``) or in card memory; ``built``: the ring
    (``{"slots", "rows"}``) the persistent tops are compiled for (default: the defaults),
    ``recorded``: the one record_xclbin writes into the manifest (default: none)."""
    import pyxrt

    from offload.host.bundle import record_xclbin, save

    p = save(kernels, tmp_path / "b.offload", meta={"model": "test"})
    entries, cus = [], {}
    for k in kernels:
        top = get_hls_kind(k.kind).top_name(k.spec)
        if top in cus or persistent.top_name(k.spec) in cus:
            continue
        base = {"kind": k.kind, "spec": k.spec.to_json(), "banks": "shared"}
        if per_call:
            cus[top] = [f"{top}_1"]
            entries.append({"name": top, "cus": cus[top], **base})
        if ring:
            rt = persistent.top_name(k.spec)
            cus[rt] = [f"{rt}_{i + 1}" for i in range(ring_cus)]
            entries.append({"name": rt, "cus": cus[rt], "ring": built or {"rows": persistent.DEFAULT_ROWS, "slots": persistent.DEFAULT_SLOTS},
                            "ring_memory": ring_memory, **base})
    xb = tmp_path / "fake.xclbin"
    pyxrt.write_xclbin(xb, entries)
    return record_xclbin(p, xb, target="u55c", platform=PLATFORM, compute_units=cus,
                         rings={k.name: recorded for k in kernels} if recorded else None)


def _sim(b, name):
    sim = open_device("sim")
    h = sim.load(b.kernels[name])
    return lambda inp: sim.run(h, inp)


def _open(b, name="sa"):
    dev = open_device("xrt:0", launch="persistent")
    return dev, dev.load_bundle(b)[name]


# -- end to end -----------------------------------------------------------------------------------
@pytest.mark.parametrize("memory", ["HOST", "card"])
def test_persistent_calls_equal_sim_with_one_run(fakes, tmp_path, memory):
    """One xrt::run at load and none per call; every answer is the sim device's on the same inputs."""
    pyxrt, _ = fakes
    b = _bundle(tmp_path, [_kernel()], ring_memory=memory)
    want = _sim(b, "sa")
    dev, h = _open(b)
    runs, dma_to = pyxrt.stats["runs"], pyxrt.stats["syncs_to_device"]
    assert runs == 1
    for i in range(3 * persistent.DEFAULT_SLOTS):  # three laps of the ring
        inp = sa.make_inputs(n=8, batch=1 + i % 7, seed=i)
        assert_same(dev.run(h, inp, timeout=5), want(inp))
    assert pyxrt.stats["runs"] == runs
    (ring,) = dev.info().details["rings"]
    assert ring["answered"] == 3 * persistent.DEFAULT_SLOTS
    if memory == "HOST":
        # A host_only ring: no DMA at all per call, only cache maintenance syncs.
        assert ring["memory"] == "host" and pyxrt.stats["host_only_allocs"] == 1
        assert pyxrt.stats["syncs_to_device"] == dma_to and pyxrt.stats["syncs_from_device"] == 0
    else:
        # Card memory: the inputs and then the request word reach the card by DMA, two syncs a call.
        assert ring["memory"] == "card" and pyxrt.stats["host_only_allocs"] == 0
        assert pyxrt.stats["syncs_to_device"] == dma_to + 2 * 3 * persistent.DEFAULT_SLOTS
    assert pyxrt.stats["clones"] == 0  # every buffer was allocated in the bank its port is wired to
    dev.close()
    # The stop word ended the loop: its one run completed, its thread is gone.
    ring_run = dev._loaded[0].state.rings[0].run
    assert ring_run.state() == pyxrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    assert not any(t.is_alive() for t in pyxrt.ring_threads)


def _embedding_kernel():
    from offload.kernels.catalogue import entries

    return entries("emb/sum/ap_fixed16_6/d16/bag20/t1")[0].build().kernel


def _mlp_kernel():
    from offload.kernels.catalogue import entries

    return next(e for e in entries() if e.kind == "mlp").build().kernel


@pytest.mark.parametrize("make", [_embedding_kernel, _mlp_kernel], ids=["embedding", "mlp"])
def test_real_kinds_run_persistent_like_sim(fakes, tmp_path, make):
    k = make()
    b = _bundle(tmp_path, [k])
    want = _sim(b, k.name)
    dev, h = _open(b, k.name)
    rng = np.random.default_rng(7)
    for case in range(3):
        inp = get_kind(k.kind).golden_inputs(k.spec, rng, case)
        assert_same(dev.run(h, inp, timeout=30), want(inp))
    dev.close()


def test_threads_get_their_own_answers(fakes, tmp_path):
    """Several threads, more requests in flight than slots: every answer is the sim answer to that
    thread's own inputs (a swapped answer differs: every request's inputs are distinct)."""
    pyxrt, _ = fakes
    b = _bundle(tmp_path, [_kernel()], ring_cus=2)
    want = _sim(b, "sa")
    dev, h = _open(b)
    bad, done = [], []

    def client(t):
        for i in range(40):
            inp = sa.make_inputs(n=8, batch=1 + (t + i) % 9, seed=1000 * t + i)
            out = dev.run(h, inp, timeout=10)
            if not np.array_equal(out["y"], want(inp)["y"]):
                bad.append((t, i))
            done.append(1)

    threads = [threading.Thread(target=client, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad and len(done) == 240
    rings = dev.info().details["rings"]
    assert sum(r["answered"] for r in rings) == 240 and all(r["answered"] for r in rings)  # both CUs served
    dev.close()


# -- a loop that stops answering ------------------------------------------------------------------
@pytest.mark.parametrize("after_compute", [False, True], ids=["dies-before", "outputs-but-no-word"])
def test_a_silent_loop_times_out_and_the_device_is_reopened(fakes, tmp_path, after_compute):
    pyxrt, _ = fakes
    b = _bundle(tmp_path, [_kernel()])
    want = _sim(b, "sa")
    pyxrt.inject_ring_fault(die_at=3, after_compute=after_compute)
    dev, h = _open(b)
    opens = pyxrt.stats["device_opens"]
    for i in range(2):
        inp = sa.make_inputs(n=8, batch=2, seed=i)
        assert_same(dev.run(h, inp, timeout=5), want(inp))
    with pytest.raises(DeviceTimeout, match=r"request 3 was not answered within 0\.2 s; the compute unit is marked hung"):
        dev.run(h, sa.make_inputs(n=8, batch=2, seed=2), timeout=0.2)
    assert pyxrt.stats["device_opens"] == opens + 1 and dev.info().details["reopens"] == 1
    # The reopened device has a new loop on a new ring; requests are numbered afresh there.
    for i in range(3):
        inp = sa.make_inputs(n=8, batch=3, seed=50 + i)
        assert_same(dev.run(h, inp, timeout=5), want(inp))
    (ring,) = dev.info().details["rings"]  # the new ring only
    assert ring["abandoned"] is None and ring["answered"] == 3
    dev.close()


def test_a_loop_whose_run_ended_fails_its_request_at_once(fakes, tmp_path):
    """The loop's one run ends in ERROR (it never served): the request fails well before its
    deadline with the run's state, and the reopened device serves."""
    pyxrt, _ = fakes
    b = _bundle(tmp_path, [_kernel()])
    want = _sim(b, "sa")
    pyxrt.inject_fault(pyxrt.ert_cmd_state.ERT_CMD_STATE_ERROR)  # the next run: the loop's start
    dev, h = _open(b)
    t0 = time.monotonic()
    with pytest.raises(DeviceError, match=r"its loop ended \(ERT_CMD_STATE_ERROR\) without answering request 1") as ei:
        dev.run(h, sa.make_inputs(n=8, batch=2), timeout=30)
    assert not isinstance(ei.value, DeviceTimeout) and time.monotonic() - t0 < 5
    assert dev.info().details["reopens"] == 1
    inp = sa.make_inputs(n=8, batch=2, seed=4)
    assert_same(dev.run(h, inp, timeout=5), want(inp))
    dev.close()


def test_without_a_timeout_a_call_still_has_a_deadline(fakes, tmp_path, monkeypatch):
    import offload.host.xrt as hx

    pyxrt, _ = fakes
    monkeypatch.setattr(hx, "PERSISTENT_TIMEOUT_S", 0.3)
    b = _bundle(tmp_path, [_kernel()])
    pyxrt.inject_ring_fault(die_at=1)
    dev, h = _open(b)
    t0 = time.monotonic()
    with pytest.raises(DeviceTimeout, match=r"within 0\.3 s"):
        dev.run(h, sa.make_inputs(n=8, batch=1))
    assert time.monotonic() - t0 < 5
    dev.close()


def test_a_late_answer_never_reaches_another_request(fakes, tmp_path):
    """The loop answers request 1 late (after its deadline): the caller gets DeviceTimeout, and the
    requests after it get their own answers from a new ring, never request 1's."""
    pyxrt, _ = fakes
    b = _bundle(tmp_path, [_kernel()])
    want = _sim(b, "sa")
    # Every request of the first loop waits up to 0.4 s before it computes.
    pyxrt.inject_ring_fault(delay_permille=1000, max_delay_us=400_000, seed=3)
    dev, h = _open(b)
    first = sa.make_inputs(n=8, batch=4, seed=99)
    with pytest.raises(DeviceTimeout):
        dev.run(h, first, timeout=0.001)
    for i in range(4):
        inp = sa.make_inputs(n=8, batch=4, seed=i)
        out = dev.run(h, inp, timeout=5)
        assert_same(out, want(inp))
        assert not np.array_equal(out["y"], want(first)["y"])
    time.sleep(0.5)  # the first loop's late answer lands now, in the abandoned ring
    inp = sa.make_inputs(n=8, batch=4, seed=7)
    assert_same(dev.run(h, inp, timeout=5), want(inp))
    dev.close()


def test_others_waiting_on_an_abandoned_ring_fail_with_an_error(fakes, tmp_path):
    """Requests queued behind one that never answers: each is answered or fails with a DeviceError,
    and the counts add up."""
    pyxrt, _ = fakes
    b = _bundle(tmp_path, [_kernel()])
    want = _sim(b, "sa")
    pyxrt.inject_ring_fault(die_at=5)
    dev, h = _open(b)
    ok, failed, wrong = [], [], []

    def client(t):
        for i in range(6):
            inp = sa.make_inputs(n=8, batch=2, seed=100 * t + i)
            try:
                out = dev.run(h, inp, timeout=0.5)
            except DeviceError as e:
                failed.append(type(e).__name__)
                continue
            (ok if np.array_equal(out["y"], want(inp)["y"]) else wrong).append(1)

    threads = [threading.Thread(target=client, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and len(ok) + len(failed) == 24
    assert "DeviceTimeout" in failed  # request 5's caller at least
    dev.close()


def test_close_during_traffic_drains_then_stops(fakes, tmp_path):
    pyxrt, _ = fakes
    b = _bundle(tmp_path, [_kernel()])
    want = _sim(b, "sa")
    dev, h = _open(b)
    ok, refused, wrong = [], [], []
    go = threading.Event()

    def client(t):
        go.wait()
        for i in range(200):
            inp = sa.make_inputs(n=8, batch=2, seed=1000 * t + i)
            try:
                out = dev.run(h, inp, timeout=5)
            except DeviceError as e:
                assert "clos" in str(e), e
                refused.append(1)
                continue
            (ok if np.array_equal(out["y"], want(inp)["y"]) else wrong).append(1)

    threads = [threading.Thread(target=client, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    go.set()
    end = time.monotonic() + 30
    while len(ok) < 20 and time.monotonic() < end:  # close in the middle of the traffic
        time.sleep(0.001)
    dev.close()
    for t in threads:
        t.join()
    assert not wrong and len(ok) + len(refused) == 800 and ok and refused
    ring = dev._loaded[0].state.rings[0]
    assert ring.inflight == 0 and ring.answered == len(ok)
    assert ring.run.state() == pyxrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED  # ended on the stop word


# -- refusals -------------------------------------------------------------------------------------
def test_a_bundle_without_the_persistent_top_is_refused(fakes, tmp_path):
    b = _bundle(tmp_path, [_kernel()], ring=False)
    dev = open_device("xrt:0", launch="persistent")
    with pytest.raises(UnsupportedError, match=r"needs the persistent top 'test_scale_add_n8_s3_ring'.*offload build") as ei:
        dev.load_bundle(b)
    assert isinstance(ei.value, NotImplementedError)
    # The same bundle runs per call.
    per_call = open_device("xrt:0")
    inp = sa.make_inputs(n=8, batch=2)
    assert_same(per_call.run(per_call.load_bundle(b)["sa"], inp), _sim(b, "sa")(inp))


def test_host_memory_not_reserved_is_refused(fakes, tmp_path):
    pyxrt, _ = fakes
    b = _bundle(tmp_path, [_kernel()], ring_memory="HOST")
    pyxrt.set_host_memory(False)
    with pytest.raises(DeviceError, match=r"host memory \(HOST\[0\]\).*xrt-smi configure --host-mem"):
        open_device("xrt:0", launch="persistent").load_bundle(b)


def test_a_pyxrt_without_what_persistence_needs_is_refused(fakes, monkeypatch):
    pyxrt, _ = fakes
    monkeypatch.delattr(pyxrt.xclbin, "get_mems")
    with pytest.raises(UnsupportedError, match=r"launch='persistent' is not possible: this pyxrt lacks xclbin.get_mems"):
        open_device("xrt:0", launch="persistent")
    open_device("xrt:0").close()  # per call still opens


def test_no_compiler_for_the_ring_helpers_is_refused(fakes, monkeypatch):
    from offload.hls.csim import ToolchainMissing

    def missing():
        raise ToolchainMissing("g++ not found on PATH")

    monkeypatch.setattr(persistent, "ring_ops", missing)
    with pytest.raises(UnsupportedError, match="acquire/release helpers cannot be built: g\\+\\+ not found"):
        open_device("xrt:0", launch="persistent")


def test_a_request_larger_than_a_slot(fakes, tmp_path):
    """Too many rows for a slot: per call when the xclbin has the per-call top, else refused naming
    the field and the limit, before any device work."""
    pyxrt, _ = fakes
    rows = persistent.DEFAULT_ROWS + 1
    inp = sa.make_inputs(n=8, batch=rows)
    (tmp_path / "both").mkdir()
    b = _bundle(tmp_path / "both", [_kernel()])
    dev, h = _open(b)
    runs = pyxrt.stats["runs"]
    assert_same(dev.run(h, inp, timeout=5), _sim(b, "sa")(inp))
    assert pyxrt.stats["runs"] == runs + 1
    dev.close()
    (tmp_path / "ring").mkdir()
    b2 = _bundle(tmp_path / "ring", [_kernel()], per_call=False)
    dev2, h2 = _open(b2)
    before = dict(pyxrt.stats)
    with pytest.raises(InputError, match=rf"x: {rows * 8} elements exceed the ring slot's {persistent.DEFAULT_ROWS * 8}"):
        dev2.run(h2, inp, timeout=5)
    assert pyxrt.stats == before
    dev2.close()


def test_an_unknown_launch_mode_is_refused(fakes):
    with pytest.raises(InputError, match="launch"):
        open_device("xrt:0", launch="sometimes")


def test_pynq_refuses_persistent_with_the_reason(pynq_fakes):
    with pytest.raises(UnsupportedError, match=r"'pynq:0'.*persistent.*no host_only flag.*open_device\('xrt:0', launch='persistent'\)"):
        open_device("pynq:0", launch="persistent")


def test_devices_say_which_launch_modes_xrt_offers(fakes, monkeypatch):
    from offload.host.device import probe_devices

    xrt = next(p for p in probe_devices() if p.backend == "xrt")
    assert "launch modes: per_call, persistent" in xrt.why
    monkeypatch.delattr(fakes[0].bo, "map")
    xrt = next(p for p in probe_devices() if p.backend == "xrt")
    assert "launch modes: per_call only (persistent: this pyxrt lacks bo.map" in xrt.why


# -- the stand-in's profiles: what each release binds for this path -------------------------------
@pytest.mark.parametrize("version", ["2.11", "2.12", "2.16", "2.17", "2.23"])
def test_profiles_bind_host_memory_and_registers_as_the_releases_do(monkeypatch, version):
    """pyxrt.cpp: bo.flags.host_only and bo.map in every release from 2.11; xclbin.get_mems from
    2.12; kernel.read_register/write_register in 2.11 only; xrt::ip and run.abort in none."""
    pyxrt, _ = install_fakes(monkeypatch, xrt=version)
    assert hasattr(pyxrt.bo.flags, "host_only") and hasattr(pyxrt.bo, "host_only") and hasattr(pyxrt.bo, "map")
    assert hasattr(pyxrt.xclbin, "get_mems") == (version != "2.11")
    assert hasattr(pyxrt.kernel, "read_register") == hasattr(pyxrt.kernel, "write_register") == (version == "2.11")
    assert not hasattr(pyxrt, "ip") and not hasattr(pyxrt.run, "abort")


def test_info_says_which_launch_modes_a_bundle_offers(fakes, tmp_path):
    import json

    from click.testing import CliRunner

    from offload.cli import main

    (tmp_path / "both").mkdir()
    (tmp_path / "per").mkdir()
    both = _bundle(tmp_path / "both", [_kernel()])
    per = _bundle(tmp_path / "per", [_kernel()], ring=False)
    got = {}
    for name, b in (("both", both), ("per", per)):
        r = CliRunner().invoke(main, ["info", str(b.path), "--json"])
        assert r.exit_code == 0, r.output
        got[name] = json.loads(r.output)["launch"]["card (u55c)"]
    assert got["both"]["modes"] == ["per_call", "persistent"]
    assert got["per"]["modes"] == ["per_call"] and "lacks test_scale_add_n8_s3_ring" in got["per"]["why"]
    r = CliRunner().invoke(main, ["info", str(per.path)])
    assert "launch modes on card (u55c): per_call (" in r.output
    r = CliRunner().invoke(main, ["devices", "--json"])
    xrt = next(d for d in json.loads(r.output) if d["backend"] == "xrt")
    assert xrt["launch_modes"] == ["per_call", "persistent"] and "launch modes: per_call, persistent" in xrt["why"]


def test_info_and_load_agree_on_a_bundle_that_records_no_compute_units(fakes, tmp_path):
    """One check behind both (Bundle.xclbin_lacks): an xclbin with its compute units unrecorded
    leaves the card to tell, so load(launch="persistent") takes it and info offers both modes,
    while a recorded xclbin without the loop is refused by load and shown without it by info."""
    import json

    from click.testing import CliRunner

    from offload.cli import main
    from offload.host.bundle import load, record_xclbin

    (tmp_path / "per").mkdir()
    per = _bundle(tmp_path / "per", [_kernel()], ring=False)
    assert per.xclbin_lacks("persistent") == [persistent.top_name(_kernel().spec)] and per.xclbin_lacks("per_call") == []
    with pytest.raises(UnsupportedError, match="its xclbin lacks the persistent top"):
        load(per.path, launch="persistent")
    bare = record_xclbin(per.path, per.xclbin, target="u55c", platform=PLATFORM)
    assert bare.compute_units == {} and bare.xclbin_lacks("persistent") is None
    assert load(bare.path, launch="persistent").launch == "persistent"
    r = CliRunner().invoke(main, ["info", str(bare.path), "--json"])
    assert r.exit_code == 0, r.output
    card = json.loads(r.output)["launch"]["card (u55c)"]
    assert card["modes"] == ["per_call", "persistent"] and "records no compute units" in card["why"]


# -- the ring size the bundle records ----------------------------------------------------------------
def test_the_ring_the_bundle_records_is_the_one_opened(fakes, tmp_path):
    """The xclbin's loop was compiled for 2 slots of 3 rows, as the manifest records: the host's
    ring must be that one (a default 8-slot ring would put requests where the loop never looks)."""
    size = {"slots": 2, "rows": 3}
    b = _bundle(tmp_path, [_kernel()], built=size, recorded=size)
    assert b.rings["sa"].slots == 2 and json.loads((b.path / "manifest.json").read_text())["kernels"][0]["ring"] == size
    want = _sim(b, "sa")
    dev, h = _open(b)
    for i in range(7):  # laps of the 2 slots
        inp = sa.make_inputs(n=8, batch=1 + i % 3, seed=i)
        assert_same(dev.run(h, inp, timeout=5), want(inp))
    (ring,) = dev.info().details["rings"]
    assert (ring["slots"], ring["rows"], ring["answered"]) == (2, 3, 7)
    # 4 rows exceed the recorded 3: they run per call (the xclbin has the per-call top).
    assert_same(dev.run(h, sa.make_inputs(n=8, batch=4), timeout=5), want(sa.make_inputs(n=8, batch=4)))
    assert dev.info().details["rings"][0]["answered"] == 7
    dev.close()


def test_a_device_opened_for_another_ring_refuses_the_bundle_naming_both(fakes, tmp_path):
    from offload.host.xrt import XrtDevice

    pyxrt, _ = fakes
    size = {"slots": 2, "rows": 3}
    b = _bundle(tmp_path, [_kernel()], built=size, recorded=size)
    dev = XrtDevice("xrt:0", "persistent", ring_slots=8)
    with pytest.raises(BundleError, match=r"kernel 'sa': its persistent top was built for a ring of 2 slots of 3 rows, "
                                          r"and device 'xrt:0' was opened with ring_slots=8"):
        dev.load_bundle(b)
    assert pyxrt.stats["runs"] == 0 and dev.info().details["kernels"] == []  # refused before the card was touched
    dev.close()
    dev = XrtDevice("xrt:0", "persistent", ring_slots=2, ring_rows=3)  # the same ring: accepted
    h = dev.load_bundle(b)["sa"]
    inp = sa.make_inputs(n=8, batch=3)
    assert_same(dev.run(h, inp, timeout=5), _sim(b, "sa")(inp))
    dev.close()


def test_an_unrecorded_bundle_uses_the_device_ring_or_the_defaults(fakes, tmp_path):
    from offload.host.xrt import XrtDevice

    b = _bundle(tmp_path, [_kernel()], built={"slots": 4, "rows": 2})  # built by hand, not recorded
    assert b.rings == {}
    dev = XrtDevice("xrt:0", "persistent", ring_slots=4, ring_rows=2)
    h = dev.load_bundle(b)["sa"]
    for i in range(6):
        inp = sa.make_inputs(n=8, batch=2, seed=i)
        assert_same(dev.run(h, inp, timeout=5), _sim(b, "sa")(inp))
    assert dev.info().details["rings"][0]["slots"] == 4
    dev.close()


def test_load_refuses_persistent_where_the_xclbin_lacks_the_ring_tops(fakes, tmp_path):
    from offload.host.bundle import load

    b = _bundle(tmp_path, [_kernel()], ring=False)
    with pytest.raises(UnsupportedError, match=r"launch='persistent' is not possible: its xclbin lacks the persistent top\(s\) "
                                               r"test_scale_add_n8_s3_ring: rebuild it"):
        load(b.path, launch="persistent")
    assert "xclbin lacks" in load(b.path, launch="auto").launch_why
    assert load(_bundle(tmp_path / "r", [_kernel()]).path, launch="persistent").launch_why == ""
