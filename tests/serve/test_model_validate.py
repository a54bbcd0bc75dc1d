"""The service checks each request with the MLP kind's input half (validate_inputs): the same
refusals, word for word, as the kind's whole validate, which the sim device still runs per batch."""

from __future__ import annotations

import numpy as np
import pytest

import _serve_standin as standin
from offload.kernels import get_kind
from offload.kernels.mlp import validate_inputs
from offload.serve.model import served_model


@pytest.fixture(scope="module")
def model():
    from offload.host.bundle import load

    return served_model(load(standin.risk_bundle_path()))


def _bad(width: int) -> dict[str, np.ndarray]:
    nan = np.zeros((3, width))
    nan[2, 5] = np.nan
    inf = np.zeros((1, width))
    inf[0, 0] = -np.inf
    return {"nan": nan, "inf": inf, "ints": np.zeros((1, width), dtype=np.int32), "width": np.zeros((1, width + 1)), "rank": np.zeros(width)}


def test_the_input_half_refuses_exactly_what_the_whole_check_refuses(model):
    k = model.kernel
    for name, x in _bad(model.input.width).items():
        with pytest.raises((ValueError, TypeError)) as whole:
            get_kind(k.kind).validate(k.spec, k.tensors, {"x": x})
        with pytest.raises(type(whole.value)) as half:
            validate_inputs(k.spec, {"x": x})
        assert str(half.value) == str(whole.value), name
        with pytest.raises(type(whole.value)):
            model.validate(x)
    validate_inputs(k.spec, {"x": np.zeros((4, model.input.width))})  # a good batch passes
