"""Where save() may write and what load() says about a path that is no bundle, and a bundle that
carries its xclbin: the cases the mutation run (TESTING.md) found untested."""

from __future__ import annotations

import pytest

import offload
from _host_util import sa
from offload.host.bundle import Bundle, BundleError, load, save


def _bundle(**kw) -> Bundle:
    k = sa.make_kernel("emb0", n=8, scale=3, seed=1)
    return Bundle("m", {k.name: k}, **kw)


def test_save_refuses_an_existing_regular_file(tmp_path):
    dest = tmp_path / "m.offload"
    dest.write_text("someone else's file")
    with pytest.raises(FileExistsError, match="is not an offload bundle; refusing to overwrite it"):
        save(_bundle(), dest)
    assert dest.read_text() == "someone else's file"


def test_save_accepts_an_existing_empty_folder(tmp_path):
    dest = tmp_path / "m.offload"
    dest.mkdir()
    save(_bundle(), dest)
    assert set(load(dest).kernels) == {"emb0"}


def test_load_of_a_missing_path_says_so(tmp_path):
    with pytest.raises(BundleError, match="is not an offload bundle: no such folder"):
        load(tmp_path / "nowhere")


def test_a_bundle_keeps_its_xclbin(tmp_path):
    xclbin = tmp_path / "k.xclbin"
    xclbin.write_bytes(b"\0" * 64)
    p = offload.save(_bundle(xclbin=xclbin, target="hw", platform="xilinx_u55c_gen3x16_xdma_3_202210_1"), tmp_path / "x.offload")
    b = load(p)
    assert b.xclbin is not None and b.xclbin.read_bytes() == b"\0" * 64
    assert b.target == "hw" and b.platform == "xilinx_u55c_gen3x16_xdma_3_202210_1"
