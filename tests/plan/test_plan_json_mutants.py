"""offload.plan.Plan on hand-written plans: the JSON file read back and written out byte for byte,
an older file without ``reserve``, malformed files refused, the per-bank sums, the channel
balance, and every column of ``explain()``. Each test fails on a cosmic-ray mutant that the
planner's tests let through (TESTING.md, "Mutation testing")."""

from __future__ import annotations

import json

import pytest

from offload.plan import Plan, Shard, TablePlan, Topology
from offload.sim.errors import InputError

FMT = "ap_fixed<16,6>"


def _s(h, c, kind, bank, r0, r1, nbytes, t, c0=0, c1=16):
    return Shard(h, c, kind, bank, r0, r1, c0, c1, nbytes, t, 1.0)


def _plan() -> Plan:
    # Four cards, three used; HBM times 2, 1 and 1 us on one card (balance 2 / (4/3) = 1.5).
    topo = Topology(hosts=[["u280", "u280"], ["u250", "u250"]], onchip_share=0.5)
    users = TablePlan("users", 1000, 16, FMT, "row_wise", 2.0, ("u",),
                      (_s(0, 0, "HBM", 0, 0, 500, 16000, 2e-6), _s(0, 0, "HBM", 1, 500, 800, 9600, 1e-6),
                       _s(0, 0, "HBM", 3, 800, 1000, 6400, 1e-6), _s(1, 0, "DDR", 2, 0, 0, 1000, 0.5e-6)))
    merged = TablePlan("c*d", 24, 5, FMT, "table_wise", 1.0, ("c", "d"), (_s(0, 1, "onchip", 0, 0, 24, 240, 1e-7, 0, 5),),
                       ("c", "d"), (6, 4), (2, 3))
    big = TablePlan("big", 10**8, 16, FMT, "table_wise", 1.0, ("b",), (_s(1, 0, "DDR", 0, 0, 10**8, 2_500_000_000, 1e-2),))
    mid = TablePlan("mid", 10, 16, FMT, "table_wise", 1.0, ("m",), (_s(1, 0, "DDR", 2, 0, 10, 1_000_000, 0.25e-6),))
    small = TablePlan("small", 1, 16, FMT, "table_wise", 1.0, ("s",), (_s(1, 0, "DDR", 1, 0, 1, 999, 0.0),))
    return Plan(topo, 64, (users, merged, big, mid, small), 0.1)


def test_explain_lists_every_table_and_card():
    plan = _plan()
    lines = plan.explain().split("\n")
    assert lines[0] == "plan: 5 tables on 3 card(s) of 4, batch 64, reserve 10%"
    rows = [line.split() for line in lines[2:7]]
    assert rows == [
        ["users", "row_wise", "4", "33.00", "kB", "2.00", "us", "h0c0", "HBM[0-1,3];", "h1c0", "DDR[2]"],
        ["c*d", "(merge)", "table_wise", "1", "240", "B", "0.10", "us", "h0c1", "onchip"],
        ["big", "table_wise", "1", "2.50", "GB", "10000.00", "us", "h1c0", "DDR[0]"],
        ["mid", "table_wise", "1", "1.00", "MB", "0.25", "us", "h1c0", "DDR[2]"],
        ["small", "table_wise", "1", "999", "B", "0.00", "us", "h1c0", "DDR[1]"],
    ]
    assert lines[7] == ""
    ct = plan.card_times()
    cards = [line.split() for line in lines[9:12]]
    # card, type, bytes, HBM PCs, DDR banks, on-chip bytes, time
    assert cards == [
        ["h0c0", "u280", "32.00", "kB", "3", "0", "0", "B", *f"{ct[(0, 0)] * 1e6:.2f} us".split()],
        ["h0c1", "u280", "240", "B", "0", "0", "240", "B", *f"{ct[(0, 1)] * 1e6:.2f} us".split()],
        ["h1c0", "u250", "2.50", "GB", "0", "3", "0", "B", *f"{ct[(1, 0)] * 1e6:.2f} us".split()],
    ]
    assert lines[12] == f"predicted time per batch {max(ct.values()) * 1e6:.2f} us; busiest HBM channel / mean 1.500"
    assert len(lines) == 13
    assert "_by_name" not in repr(plan) and "users" in repr(plan)  # the name index is not a field to show


def test_bank_sums_and_channel_balance():
    plan = _plan()
    assert plan.unit_bytes()[(1, 0, "DDR", 2)] == 1000 + 1_000_000  # two tables on one bank
    assert plan.unit_times()[(1, 0, "DDR", 2)] == pytest.approx(0.75e-6, rel=1e-15)
    assert list(plan.unit_times()) == sorted(plan.unit_times())
    assert plan.channel_balance() == pytest.approx(1.5, rel=1e-15)
    ddr_only = Plan(plan.topology, 64, plan.tables[2:])
    assert ddr_only.channel_balance() == 1.0
    assert plan.cards == [(0, 0), (0, 1), (1, 0)]


def test_a_table_is_found_by_its_name_or_a_merged_part():
    plan = _plan()
    assert plan.table("c") is plan.table("d") is plan.table("c*d")
    with pytest.raises(InputError, match=r"table 'nope': not in the plan \(planned: \['big', 'c', 'c\*d', 'd', 'mid', 'small', 'users'\]\)"):
        plan.table("nope")


# A format-1 plan file as to_json writes it: keys sorted, one space a level, a newline at the end.
FILE = """{
 "batch_size": 8,
 "format": 1,
 "reserve": 0.25,
 "tables": [
  {
   "dim": 4,
   "features": [
    "f"
   ],
   "fmt": "ap_fixed<16,6>",
   "name": "t",
   "part_dims": [],
   "part_rows": [],
   "parts": [],
   "pooling_factor": 3.5,
   "rows": 10,
   "sharding": "row_wise",
   "shards": [
    {
     "bank": 2,
     "bytes": 48,
     "card": 1,
     "col0": 0,
     "col1": 4,
     "host": 0,
     "kind": "DDR",
     "lookups": 10.5,
     "row0": 0,
     "row1": 6,
     "time_s": 2e-06
    },
    {
     "bank": 0,
     "bytes": 32,
     "card": 0,
     "col0": 0,
     "col1": 4,
     "host": 1,
     "kind": "HBM",
     "lookups": 7.0,
     "row0": 6,
     "row1": 10,
     "time_s": 1e-06
    }
   ]
  }
 ],
 "topology": {
  "hosts": [
   [
    "u280",
    "u250"
   ],
   [
    "u55c"
   ]
  ],
  "network_bps": 12500000000.0,
  "network_latency_s": 1e-05,
  "onchip_bytes_per_cycle": 64,
  "onchip_share": 0.5
 }
}
"""


def test_a_plan_file_reads_back_and_writes_the_same_bytes(tmp_path):
    (tmp_path / "p.json").write_text(FILE, encoding="utf-8")
    plan = Plan.from_json(tmp_path / "p.json")
    (t,) = plan.tables
    assert plan.batch_size == 8 and plan.reserve == 0.25 and plan.topology.hosts[1][0].name == "u55c"
    assert [(s.where, s.kind, s.bank, s.row0, s.row1) for s in t.shards] == [((0, 1), "DDR", 2, 0, 6), ((1, 0), "HBM", 0, 6, 10)]
    assert plan.to_json() == FILE
    plan.to_json(tmp_path / "q.json")
    assert (tmp_path / "q.json").read_text(encoding="utf-8") == FILE


def test_an_older_file_without_reserve_or_merge_fields_reads():
    d = json.loads(FILE)
    del d["reserve"]
    for k in ("parts", "part_rows", "part_dims"):
        del d["tables"][0][k]
    plan = Plan.from_dict(d)
    assert plan.reserve == 0.0 and type(plan.reserve) is float
    assert plan.tables[0].parts == plan.tables[0].part_rows == plan.tables[0].part_dims == ()


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(format=2), "expected a plan object with format 1"),
    (lambda d: d["tables"][0].update(sharding="diagonal"), "table 't': unknown sharding 'diagonal'"),
    (lambda d: d["tables"][0].pop("rows"), r"malformed \(TypeError"),
    (lambda d: d.pop("batch_size"), r"malformed \(KeyError: 'batch_size'\)"),
    (lambda d: d["tables"][0]["shards"][0].update(card=5), "card"),
])
def test_a_malformed_file_is_refused(edit, match):
    d = json.loads(FILE)
    edit(d)
    with pytest.raises(InputError, match=match):
        Plan.from_dict(d)


def test_not_json_is_refused(tmp_path):
    (tmp_path / "p.json").write_text("{plan", encoding="utf-8")
    with pytest.raises(InputError, match="not JSON"):
        Plan.from_json(tmp_path / "p.json")
    with pytest.raises(InputError, match="format 1"):
        Plan.from_dict([])


def test_a_plan_read_back_equals_the_plan_and_explains_the_same(tmp_path):
    # Read from JSON, a shard's kind is a fresh string (not the literal the planner used): the
    # explanation counts its banks all the same, and the fields come back as tuples.
    plan = _plan()
    plan.to_json(tmp_path / "p.json")
    back = Plan.from_json(tmp_path / "p.json")
    assert back == plan and hash(back.tables) == hash(plan.tables)
    assert back.explain() == plan.explain()
    one = Plan.from_dict(json.loads(FILE))
    cards = [line.split()[:6] for line in one.explain().split("\n")[5:7]]
    assert cards == [["h0c1", "u250", "48", "B", "0", "1"], ["h1c0", "u55c", "32", "B", "1", "0"]]
