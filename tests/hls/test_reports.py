"""C-synthesis report parsers against real, unedited reports (tests/fixtures/hls-reports/README.md).

Expected values below are read off the report files by hand (the XML tags and table cells named
in each comment), not produced by the parser.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from offload.hls.reports import ReportError, find_report, parse_instances, parse_report, parse_rpt, parse_xml

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "hls-reports"
VITIS = FIX / "vitis-2020.2-gaussian"
VIVADO = FIX / "vivado-2019.2-hls4ml-autoencoder"


def test_vitis_2020_2_xml():
    r = parse_xml(VITIS / "csynth.xml")
    assert (r.top, r.part, r.tool_version) == ("gaussian", "xczu7ev-ffvc1156-2-e", "2020.2")
    assert r.target_clock_ns == 10.0  # <TargetClockPeriod>10.00
    assert r.estimated_clock_ns == 6.427  # <EstimatedClockPeriod>6.427
    assert r.fmax_mhz == pytest.approx(1000 / 6.427)
    assert (r.latency_min, r.latency_max) == (262673, 262673)  # Best-/Worst-caseLatency
    assert (r.interval_min, r.interval_max) == (262674, 262674)
    assert r.resources == {"BRAM_18K": 3, "DSP": 0, "FF": 973, "LUT": 1870, "URAM": 0}
    assert r.available == {"BRAM_18K": 624, "DSP": 1728, "FF": 460800, "LUT": 230400, "URAM": 96}


def test_vitis_2020_2_summary_rpt():
    # "|+ gaussian | - | -0.87 | 262673 | 2.627e+06 | - | 262674 | - | no | 3 (~0%) | - | 973 (~0%) | 1870 (~0%) | - |"
    r = parse_rpt(VITIS / "csynth.rpt")
    assert (r.top, r.part, r.tool_version) == ("gaussian", "xczu7ev-ffvc1156-2-e", "2020.2")
    assert (r.latency_min, r.latency_max) == (262673, 262673)
    assert (r.interval_min, r.interval_max) == (262674, 262674)
    # "-" in a resource column means none used.
    assert r.resources == {"BRAM_18K": 3, "DSP": 0, "FF": 973, "LUT": 1870, "URAM": 0}
    # The summary layout states no clock periods and no part totals: unknown, not guessed.
    assert r.target_clock_ns is None and r.estimated_clock_ns is None and r.fmax_mhz is None
    assert r.available == {}


def test_vivado_2019_2_xml():
    r = parse_xml(VIVADO / "myproject_csynth.xml")
    assert (r.top, r.part, r.tool_version) == ("myproject", "xc7z020-clg400-1", "2019.2.1")
    assert (r.target_clock_ns, r.estimated_clock_ns) == (5.0, 4.429)
    assert (r.latency_min, r.latency_max) == (96014, 96165)
    assert (r.interval_min, r.interval_max) == (4625, 95949)  # dataflow throughput range
    # <DSP48E> on 7-series is reported under the canonical name DSP.
    assert r.resources == {"BRAM_18K": 285, "DSP": 118, "FF": 51414, "LUT": 33365, "URAM": 0}
    assert r.available == {"BRAM_18K": 280, "DSP": 220, "FF": 106400, "LUT": 53200, "URAM": 0}


def test_vivado_2019_2_classic_rpt():
    # Timing "|ap_clk | 5.00 ns | 4.429 ns | 0.62 ns |", latency "|96014|96165| 0.480 ms | 0.481 ms |4625|95949| dataflow |",
    # utilization "|Total | 285| 118| 51414| 33365| 0|" and "|Available | 280| 220| 106400| 53200| 0|".
    r = parse_rpt(VIVADO / "myproject_csynth.rpt")
    assert (r.top, r.part, r.tool_version) == ("myproject", "xc7z020-clg400-1", "2019.2.1")
    assert (r.target_clock_ns, r.estimated_clock_ns) == (5.0, 4.429)
    assert (r.latency_min, r.latency_max, r.interval_min, r.interval_max) == (96014, 96165, 4625, 95949)
    # The per-instance "Total" rows further down (31 BRAM, 254 FIFO BRAM) must not be taken.
    assert r.resources == {"BRAM_18K": 285, "DSP": 118, "FF": 51414, "LUT": 33365, "URAM": 0}
    assert r.available == {"BRAM_18K": 280, "DSP": 220, "FF": 106400, "LUT": 53200, "URAM": 0}


def test_vivado_2019_2_instances():
    # Latency "Detail: Instance" rows, e.g. "|conv_2d_cl_array_array_ap_fixed_1u_config20_U0 |conv_2d_cl_array_array_ap_fixed_1u_config20_s
    # | 4624| 95948| 23.120 us | 0.480 ms | 4624| 95948| none |", and utilization rows, e.g. the same instance
    # "| 1| 2| 4419| 1802| 0|" under BRAM_18K, DSP48E, FF, LUT, URAM.
    inst = parse_instances(VIVADO / "myproject_csynth.rpt")
    assert len(inst) == 27  # 27 rows in each of the two Instance tables
    c20 = inst["conv_2d_cl_array_array_ap_fixed_1u_config20_U0"]
    assert c20.module == "conv_2d_cl_array_array_ap_fixed_1u_config20_s"
    assert (c20.latency_min, c20.latency_max, c20.interval_min, c20.interval_max) == (4624, 95948, 4624, 95948)
    assert c20.resources == {"BRAM_18K": 1, "DSP": 2, "FF": 4419, "LUT": 1802, "URAM": 0}
    z25 = inst["zeropad2d_cl_array_array_ap_fixed_4u_config25_U0"]
    assert (z25.latency_max, z25.resources["LUT"]) == (39, 317)
    # The instance table's "Total" row is not an instance; its figures are the instances' sums.
    assert "Total" not in inst
    assert sum(i.resources["DSP"] for i in inst.values()) == 118
    assert sum(i.resources["BRAM_18K"] for i in inst.values()) == 31


def test_instances_only_from_a_classic_report(tmp_path):
    with pytest.raises(ReportError, match="classic"):
        parse_instances(VITIS / "csynth.rpt")  # the 2020.2 summary layout has no Instance tables
    with pytest.raises(ReportError, match="classic"):
        parse_instances(VIVADO / "myproject_csynth.xml")
    # An unknown latency ("?") is None, not a shifted column.
    text = (VIVADO / "myproject_csynth.rpt").read_text()
    row = "|     4624|    95948| 23.120 us |  0.480 ms |  4624|  95948|   none  |"
    assert row in text
    p = tmp_path / "q_csynth.rpt"
    p.write_text(text.replace(row, "|        ?|        ?|     ?     |     ?     |     ?|      ?|   none  |"))
    c20 = parse_instances(p)["conv_2d_cl_array_array_ap_fixed_1u_config20_U0"]
    assert (c20.latency_min, c20.latency_max, c20.interval_max) == (None, None, None)
    assert c20.resources["DSP"] == 2


@pytest.mark.parametrize("folder", [VITIS, VIVADO], ids=["vitis2020.2", "vivado2019.2"])
def test_xml_and_rpt_agree(folder):
    xml = parse_report(next(folder.glob("*.xml")))
    rpt = parse_report(next(folder.glob("*.rpt")))
    a, b = xml.to_json(), rpt.to_json()
    shared = [k for k in a if k not in ("source", "available") and a[k] is not None and b[k] is not None]
    assert {"top", "part", "latency_min", "latency_max", "interval_min", "interval_max", "resources"} <= set(shared)
    for k in shared:
        assert a[k] == b[k], k
    if rpt.available:
        assert rpt.available == xml.available


def test_variable_latency_question_mark_is_unknown(tmp_path):
    # A loop with an unknown trip count prints "?" in the latency cells.
    text = (VIVADO / "myproject_csynth.rpt").read_text()
    row = "    |    96014|    96165| 0.480 ms | 0.481 ms |  4625|  95949| dataflow |"
    assert row in text
    p = tmp_path / "q_csynth.rpt"
    p.write_text(text.replace(row, "    |        ?|        ?|     ?    |     ?    |     ?|      ?| dataflow |"))
    r = parse_rpt(p)
    assert r.latency_min is None and r.latency_max is None and r.interval_min is None
    assert r.resources["LUT"] == 33365


def test_not_a_report(tmp_path):
    p = tmp_path / "x.rpt"
    p.write_text("hello\n")
    with pytest.raises(ReportError, match="x.rpt"):
        parse_rpt(p)
    q = tmp_path / "x.xml"
    q.write_text("<profile><foo/>")
    with pytest.raises(ReportError, match="not well-formed"):
        parse_xml(q)
    q.write_text("<profile><foo/></profile>")
    with pytest.raises(ReportError, match="PerformanceEstimates"):
        parse_xml(q)
    with pytest.raises(ReportError, match=r"\.xml or \.rpt"):
        parse_report(tmp_path / "x.txt")


def test_find_report_prefers_xml(tmp_path):
    rep = tmp_path / "solution1" / "syn" / "report"
    rep.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="csynth.xml"):
        find_report(tmp_path / "solution1", top="myproject")
    shutil.copy(VIVADO / "myproject_csynth.rpt", rep)
    assert find_report(tmp_path / "solution1", top="myproject").name == "myproject_csynth.rpt"
    shutil.copy(VIVADO / "myproject_csynth.xml", rep)
    assert find_report(tmp_path / "solution1", top="myproject").name == "myproject_csynth.xml"
