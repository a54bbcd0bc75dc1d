"""Every error offload raises on purpose is an ``OffloadError`` AND the builtin a caller catches.

The promise is written in ``sim/errors.py``'s module docstring and ARCHITECTURE.md ("each class also
derives from the builtin a caller would catch for the same mistake": ``ValueError`` for a bad value,
``IndexError`` for an index out of range, ``RuntimeError`` for a device failure; ``IndexRangeError``
also ``RuntimeError`` as torch raises...), and per class in its docstring. The tables below are
written by hand from those words, not read from the classes: a class that loses a base (say
``FormatOverflowError`` its ``OverflowError``) fails here. A new class must get a row: the
coverage test compares each module's ``__all__`` with its table.
"""

from __future__ import annotations

import importlib

import pytest

from offload.sim import errors as E

# class name -> the builtins its documentation promises (besides OffloadError).
SIM_ERRORS: dict[str, tuple[type[BaseException], ...]] = {
    "OffloadError": (Exception,),
    "FormatError": (ValueError,),  # a type string that cannot be parsed: a bad value
    "InputError": (ValueError,),  # ARCHITECTURE.md: "InputError is a ValueError"
    "InputIndexError": (IndexError,),  # ARCHITECTURE.md: "InputIndexError an IndexError"
    "InputTypeError": (TypeError,),  # "an input of the wrong type or dtype"
    "InputKeyError": (KeyError, LookupError),  # "a name that is not among those the call knows"
    "IndexRangeError": (IndexError, RuntimeError),  # "IndexError for Python code, RuntimeError as torch's embedding_bag raises"
    "OffsetsError": (ValueError, RuntimeError),  # "ValueError and, as torch raises for the same offsets, RuntimeError"
    "IndexDtypeError": (TypeError, RuntimeError),  # "TypeError and, as torch raises, RuntimeError"
    "PerSampleWeightsDtypeError": (TypeError, RuntimeError),  # "TypeError and RuntimeError"
    "FormatOverflowError": (ValueError, OverflowError, ArithmeticError),  # an InputError for values a format cannot hold
    "UnsupportedError": (NotImplementedError, RuntimeError),  # "the kernels cannot implement"
    "BundleError": (ValueError,),  # a malformed or tampered file: a bad value
    "DeviceError": (RuntimeError,),  # ARCHITECTURE.md: "DeviceError a RuntimeError"
    "DeviceTimeout": (RuntimeError,),  # a DeviceError
    "ToolError": (RuntimeError,),  # an external tool failed
    "BuildError": (RuntimeError,),  # a ToolError
    "CSimError": (RuntimeError,),  # a ToolError
    "ToolchainMissing": (RuntimeError,),  # a CSimError
    "ReportError": (ValueError,),  # a report that cannot be parsed
    "GoldenError": (RuntimeError,),  # vectors that disagree
}
# The documented refinements: each is also the broader class its docstring names.
SIM_PARENTS = {
    "IndexRangeError": "InputIndexError",
    "OffsetsError": "InputError",
    "IndexDtypeError": "InputTypeError",
    "PerSampleWeightsDtypeError": "InputTypeError",
    "FormatOverflowError": "InputError",
    "DeviceTimeout": "DeviceError",
    "BuildError": "ToolError",
    "CSimError": "ToolError",
    "ToolchainMissing": "CSimError",
}
# Warnings are not errors: each is a UserWarning (what ``warnings.simplefilter`` users filter) and
# never an OffloadError (an ``except OffloadError`` must not be able to catch one turned into an error).
WARNINGS = {
    ("offload.sim.errors", "FormatOverflowWarning"),
    ("offload.quant.drift", "CalibrationDriftWarning"),
    ("offload.quant.ptq", "QuantizationBudgetWarning"),
    ("offload.host.bundle", "UnsealedBundleWarning"),
}

# offload/serve/errors.py: "Every class is an OffloadError"; 4xx refusals are the client's bad value.
SERVE_ERRORS: dict[str, tuple[type[BaseException], ...]] = {
    "ServeError": (),
    "RequestError": (ValueError,),
    "InvalidRequest": (ValueError,),
    "Unauthorized": (ValueError,),
    "UnknownModel": (ValueError, LookupError),  # a name the server does not know, like a missing key
    "BodyTooLarge": (ValueError,),
    "HeadTooLarge": (ValueError,),
    "UriTooLong": (ValueError,),
    "HeadTimeout": (ValueError, TimeoutError),  # "not fully received within header_timeout_s"
    "QueueFull": (RuntimeError,),
    "ShuttingDown": (RuntimeError,),
    "DeviceUnavailable": (RuntimeError,),
    "BadDeviceOutput": (RuntimeError,),
    "RequestTimeout": (TimeoutError,),  # "not answered within request_timeout_ms"
    "ConfigError": (ValueError,),  # "a service setting out of range"
    "DeviceOutputError": (RuntimeError,),  # a DeviceError
    "DeviceAbandoned": (RuntimeError,),  # a DeviceTimeout
}
SERVE_PARENTS = {
    "RequestError": "ServeError",
    "InvalidRequest": "RequestError",
    "UnknownModel": "RequestError",
    "HeadTimeout": "RequestError",
    "DeviceOutputError": ("offload.sim.errors", "DeviceError"),
    "DeviceAbandoned": ("offload.sim.errors", "DeviceTimeout"),
}
# Modules of the [serve] extra (pyproject.toml): only their absence skips the serve table.
_SERVE_EXTRA = {"starlette", "uvicorn", "prometheus_client", "httpx", "hdrhistogram", "matplotlib", "orjson", "msgspec",
                "aiohttp", "tritonclient", "grpc", "google", "hpack", "httptools", "uvloop", "websockets", "watchfiles"}


def _serve_errors():
    try:
        return importlib.import_module("offload.serve.errors")
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in _SERVE_EXTRA:
            pytest.skip(f"the serve extra is not installed ({e.name})")
        raise


def _check(mod, name: str, builtins: tuple[type[BaseException], ...]) -> None:
    cls = getattr(mod, name)
    assert isinstance(cls, type) and issubclass(cls, E.OffloadError), f"{name} is not an OffloadError"
    for b in builtins:
        assert issubclass(cls, b), f"{mod.__name__}.{name} is not a {b.__name__}"
        # What a caller writes: the error raised is caught by the builtin's except clause.
        try:
            raise cls("field: the limit")
        except b:
            pass


@pytest.mark.parametrize("name", sorted(SIM_ERRORS))
def test_each_sim_error_is_an_offload_error_and_its_documented_builtin(name):
    _check(E, name, SIM_ERRORS[name])
    if name in SIM_PARENTS:
        assert issubclass(getattr(E, name), getattr(E, SIM_PARENTS[name]))


@pytest.mark.parametrize("name", sorted(SERVE_ERRORS))
def test_each_serve_error_is_an_offload_error_and_its_documented_builtin(name):
    S = _serve_errors()
    _check(S, name, SERVE_ERRORS[name])
    parent = SERVE_PARENTS.get(name)
    if isinstance(parent, tuple):
        assert issubclass(getattr(S, name), getattr(importlib.import_module(parent[0]), parent[1]))
    elif parent is not None:
        assert issubclass(getattr(S, name), getattr(S, parent))


@pytest.mark.parametrize("where,name", sorted(WARNINGS))
def test_warnings_are_user_warnings_never_errors(where, name):
    cls = getattr(importlib.import_module(where), name)
    assert issubclass(cls, UserWarning) and not issubclass(cls, E.OffloadError)


def _exported_classes(mod, base: type) -> set[str]:
    return {n for n in mod.__all__ if isinstance(getattr(mod, n), type) and issubclass(getattr(mod, n), base)}


def test_every_exported_error_has_a_row():
    """A class added to a hierarchy module must be added to its table above (its builtin decided)."""
    assert _exported_classes(E, BaseException) - {"FormatOverflowWarning"} == set(SIM_ERRORS)
    assert _exported_classes(_serve_errors(), BaseException) == set(SERVE_ERRORS)
