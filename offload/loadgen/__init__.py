"""Open-loop constant-rate load against an OIP v2 endpoint (``offload bench``): latency measured
from each request's due time, HDR percentiles, JSON and a PNG plot."""

from offload.loadgen.openloop import MAX_DURATION_S, MAX_REQUESTS, LoadResult, run_load, write_report

__all__ = ["LoadResult", "run_load", "write_report", "MAX_DURATION_S", "MAX_REQUESTS"]
