"""Large bundle files are hashed, not only sized: one altered byte, same size, and load refuses.

``offload.host.bundle``'s contract (its module docstring): a missing, truncated or altered file is
refused (sha256), and tensors of 16 MiB or more are memory-mapped rather than read whole; the xclbin
is hashed too. The memory-mapped path never holds the bytes, so its hash is a separate streaming
read: these cases alter one byte of a tensor on each side of the 16 MiB edge (the last size read
whole, 16 MiB - 128 bytes, and the first mapped, exactly 16 MiB) and of the xclbin, keeping every
file's size, so a size-only check cannot tell.
"""

from __future__ import annotations

import json
import sys
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest

import offload
from offload.host.bundle import BundleError, load, record_xclbin, save
from offload.kernels.embedding import TableSpec, make_kernel, make_spec

MiB = 1 << 20
DIM = 64  # int16 rows of 128 bytes: 131072 rows are exactly 16 MiB


def _kernel(rows: int):
    spec = make_spec([TableSpec("big", rows, DIM, "ap_fixed<16,6>")], mode="sum", max_bag_size=4)
    rng = np.random.default_rng(zlib.crc32(f"big{rows}".encode()))
    return make_kernel("big", spec, [rng.integers(-4096, 4096, size=(rows, DIM)) / 256.0])


def _tensor_file(p: Path) -> Path:
    m = json.loads((p / "manifest.json").read_text())
    return p / m["kernels"][0]["tensors"]["table0"]["file"]


def _flip(f: Path, at: int) -> None:
    """Change one byte in place: the size stays, the content does not."""
    with open(f, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x01]))


@pytest.fixture(scope="module", params=[16 * MiB // (2 * DIM) - 1, 16 * MiB // (2 * DIM)], ids=["16MiB-128B", "16MiB"])
def saved(request, tmp_path_factory):
    rows = request.param
    k = _kernel(rows)
    p = save([k], tmp_path_factory.mktemp("b") / "m.offload")
    return k, p


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_altered_byte_in_a_tensor_is_refused_on_both_sides_of_the_mmap_edge(saved, where, tmp_path):
    k, p = saved
    f = _tensor_file(p)
    size = f.stat().st_size
    assert size == k.tensors["table0"].nbytes and size in (16 * MiB - 2 * DIM, 16 * MiB)
    b = load(p)  # intact: loads, the big one memory-mapped (the documented edge is >= 16 MiB)
    assert isinstance(b.kernels["big"].tensors["table0"], np.memmap) == (size >= 16 * MiB)
    np.testing.assert_array_equal(b.kernels["big"].tensors["table0"], k.tensors["table0"])
    del b
    at = {"first": 0, "middle": size // 2 + 7, "last": size - 1}[where]
    _flip(f, at)
    try:
        assert f.stat().st_size == size
        with pytest.raises(BundleError, match="does not match its sha256"):
            load(p)
    finally:
        _flip(f, at)  # the module's bundle is shared by the other cases
    assert isinstance(load(p), offload.host.bundle.Bundle)


def _xclbin(path: Path, nbytes: int) -> str:
    """An axlf file of ``nbytes``: magic and header UUID where XRT's xclbin.h puts them, rest filler."""
    u = uuid.UUID(int=zlib.crc32(path.name.encode()))
    head = bytearray(b"\xff" * 448)
    head[:8] = b"xclbin2\0"
    head[416:432] = u.bytes  # axlf (304 bytes to the header) + 112 bytes into axlf_header
    rng = np.random.default_rng(zlib.crc32(path.name.encode()))
    path.write_bytes(bytes(head) + rng.integers(0, 256, size=nbytes - len(head), dtype=np.uint8).tobytes())
    return str(u)


@pytest.mark.parametrize("nbytes", [4096, 16 * MiB + 1], ids=["4KiB", "16MiB+1"])
@pytest.mark.parametrize("where", ["header", "last"])
def test_one_altered_byte_in_the_xclbin_is_refused(tmp_path, monkeypatch, nbytes, where):
    monkeypatch.setitem(sys.modules, "pyxrt", None)  # the UUID from the axlf header, not a stand-in pyxrt
    p = save([_kernel(8)], tmp_path / "x.offload")
    u = _xclbin(tmp_path / "k.xclbin", nbytes)
    b = record_xclbin(p, tmp_path / "k.xclbin", target="u55c", platform="xilinx_u55c_gen3x16_xdma_3_202210_1", uuid=u)
    assert b.xclbin_uuid == u and b.xclbin.stat().st_size == nbytes
    at = {"header": 8, "last": nbytes - 1}[where]
    _flip(b.xclbin, at)
    assert b.xclbin.stat().st_size == nbytes
    with pytest.raises(BundleError, match="xclbin file offload.xclbin does not match its sha256"):
        load(p)
