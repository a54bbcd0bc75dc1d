"""The HLS kernel regression runner behind ``offload regress``.

For each selected catalogue entry (:mod:`offload.kernels.catalogue`):

1. **golden**: its golden vectors are loaded and the catalogue is checked to still build the same
   kernel (spec, tensors, inputs); a difference means the vectors are stale.
2. **sim**: the bit-exact reference model reproduces the expected raw outputs, zero mismatches.
3. **csim**: the kernel's generated HLS C++, compiled with g++ (cached by content hash) and run
   through a device with card semantics (the caller passes one, normally ``open_device("emu")``:
   this layer does not import ``offload.host``), reproduces them bit for bit.
4. optionally **csynth** (``vitis-run`` or ``vitis_hls`` on PATH): a Tcl project is written and
   synthesised, the report parsed (:mod:`offload.hls.reports`) and compared with the committed
   baseline of the target part (``kernels/baselines/<part>.json``) within :class:`Tolerances`;
   **cosim**: a generated C testbench drives ``cosim_design`` with the golden inputs and the
   buffers it writes back are unpacked and compared with the golden outputs.

One module per job: :mod:`.report` (checks, results, the JSON/markdown report), :mod:`.baselines`
(synthesis baselines and tolerances), :mod:`.golden` (selection, staleness, regeneration),
:mod:`.synth` (the Vitis HLS project of one entry; the tools themselves are started by
:mod:`offload.hls.vitis`, shared with :mod:`offload.hls.build`) and :mod:`.run` (the stages of an
entry, entries in parallel threads).

Example::

    from offload.host import open_device
    from offload.hls.regress import run_regression
    rep = run_regression("emb/sum/*", device=open_device("emu"), jobs=2)
    print(rep.ok, rep.to_markdown())
"""

from offload.hls.regress.baselines import Tolerances, baselines_dir, compare_baseline, read_baselines, write_baselines
from offload.hls.regress.golden import describe_change, regenerate
from offload.hls.regress.report import Check, EntryResult, RegressReport, compare_outputs
from offload.hls.regress.run import DEFAULT_CLOCK_NS, DEFAULT_PART, check_entry, run_regression
from offload.hls.regress.synth import depth_shortfalls, read_testbench_outputs, testbench
from offload.hls.vitis import synthesis_tcl, vitis_hls

__all__ = [
    "DEFAULT_PART",
    "DEFAULT_CLOCK_NS",
    "Tolerances",
    "Check",
    "EntryResult",
    "RegressReport",
    "check_entry",
    "run_regression",
    "regenerate",
    "compare_outputs",
    "compare_baseline",
    "baselines_dir",
    "read_baselines",
    "write_baselines",
    "synthesis_tcl",
    "testbench",
    "vitis_hls",
    "read_testbench_outputs",
    "depth_shortfalls",
    "describe_change",
]
