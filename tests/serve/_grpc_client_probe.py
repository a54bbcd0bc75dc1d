"""A stock ``tritonclient.grpc`` client in a process of its own, run by test_grpc.py with the
grpc core setting README.md gives clients (``GRPC_EXPERIMENTS`` is read once, when grpc is first
imported, so a setting needs a process of its own):

    python _grpc_client_probe.py HOST:PORT KEY ROWS.npy infer N
    python _grpc_client_probe.py HOST:PORT KEY ROWS.npy deadline SECONDS

``infer`` sends ROWS as one request, then its first row N times, and prints one JSON line: the
first answer's ``y`` as float32 bit patterns and its shape, and the voluntary context switches of
grpc core's EventEngine worker threads over the N calls (Linux, from /proc). ``deadline`` sends
the first row with a client deadline of SECONDS and prints the call's status (JSON).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException


def _event_engine_wakeups() -> int:
    total = 0
    for t in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            if (t / "comm").read_text().strip() == "event_engine":
                total += int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", (t / "status").read_text(), re.M).group(1))
        except FileNotFoundError:  # a worker that exited between the listing and the read
            continue
    return total


def _input(x: np.ndarray) -> list:
    i = tgrpc.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return [i]


def main() -> None:
    url, key, rows, mode = sys.argv[1], sys.argv[2], np.load(sys.argv[3]), sys.argv[4]
    c = tgrpc.InferenceServerClient(url)
    auth = {"authorization": f"Bearer {key}"}
    if mode == "deadline":
        try:
            c.infer("risk", _input(rows[:1]), headers=auth, client_timeout=float(sys.argv[5]))
            out = {"status": "OK"}
        except InferenceServerException as e:
            out = {"status": e.status()}
    else:
        y = c.infer("risk", _input(rows), headers=auth).as_numpy("y")
        one = _input(rows[:1])
        before = _event_engine_wakeups()
        for _ in range(int(sys.argv[5])):
            c.infer("risk", one, headers=auth)
        out = {"y_bits": y.view(np.uint32).ravel().tolist(), "shape": list(y.shape), "event_engine_wakeups": _event_engine_wakeups() - before}
    c.close()
    print(json.dumps(out))

if __name__ == "__main__":
    main()
