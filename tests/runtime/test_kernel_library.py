"""The kernel library's design cache (runtime/dispatcher.KernelLibrary) keyed by a config's values and their types."""

from dataclasses import asdict

import pytest

from tilepilot.errors import ConfigError
from tilepilot.kernels.bind import config_key, config_of_key
from tilepilot.kernels.registry import family
from tilepilot.runtime.dispatcher import KernelLibrary


def test_a_float_config_equal_to_an_int_one_is_built_on_its_own_and_refused_not_handed_the_int_design():
    """64.0 == 64, yet a float tile size does not build: the library must not hand it the int config's design, and
    the plan's error names the key and the type it needs."""
    gemm = family("gemm")
    shape = gemm.Shape(m=256, n=256, k=256)
    ints = asdict(gemm.default_config(shape))
    floats = {k: float(v) if type(v) is int else v for k, v in ints.items()}
    assert floats == ints and config_key(floats) != config_key(ints)
    assert config_of_key(config_key(floats)) == floats
    assert all(type(v) is float for k, v in config_of_key(config_key(floats)).items() if type(ints[k]) is int)
    lib = KernelLibrary()
    key, design = lib.design("gemm", shape, ints)
    assert lib.design("gemm", shape, dict(ints))[1] is design  # the same config asked again: the cached design
    with pytest.raises(ConfigError, match=r"gemm config \w+=\d+\.0 is float; it must be int"):
        lib.design("gemm", shape, floats)
