"""Kernel registry: family lookup by name, validated rows persisted as JSON, best-config lookup, merge."""

from __future__ import annotations

import json

import pytest

from tilepilot.errors import ConfigError
from tilepilot.kernels import gemm, gemv, lm_head
from tilepilot.kernels.registry import FAMILIES, Registry, RegistryRow, canonical, family


def test_families_by_name_include_the_matrix_kernels_and_follow_the_contract():
    for name in ("gemm", "gemv", "eltwise", "lm_head"):
        mod = family(name)
        assert mod.FAMILY == name
        for attr in ("Shape", "Config", "default_config", "candidate_configs", "make_design", "reference"):
            assert hasattr(mod, attr), f"{name} lacks {attr}"
    assert family("gemv") is gemv and FAMILIES["lm_head"] is lm_head
    with pytest.raises(ConfigError, match="Unknown kernel family 'conv2d'"):
        family("conv2d")


SQUARE = gemv.Shape(2048, 2048)


def _row(cfg: gemv.Config, seconds: float, shape: gemv.Shape = SQUARE, **kw) -> RegistryRow:
    return RegistryRow(family="gemv", shape=shape, config=cfg, modeled_s=seconds, **kw)


def test_best_returns_the_fastest_row_for_that_exact_shape():
    reg = Registry()
    a, b = gemv.Config(tile_m=8), gemv.Config(tile_m=16)
    reg.add(_row(a, 3e-4))
    reg.add(_row(b, 2e-4))
    reg.add(_row(b, 1e-5, shape=gemv.Shape(512, 2048)))  # another shape never answers for this one
    best = reg.best("gemv", gemv.Shape(2048, 2048))
    assert best is not None and best.config == canonical_dict(b) and best.modeled_s == 2e-4
    assert reg.best("gemv", gemv.Shape(4096, 2048)) is None
    assert reg.best("gemm", gemv.Shape(2048, 2048)) is None


def canonical_dict(cfg) -> dict:
    return json.loads(canonical(cfg))


def test_same_config_replaces_its_row_and_keeps_known_gate_metrics():
    reg = Registry()
    cfg = gemv.Config()
    reg.add(_row(cfg, 3e-4, gate={"pearson": 0.9999}, source="phase1"))
    reg.add(_row(cfg, 2.5e-4, source="tune"))
    rows = reg.rows("gemv")
    assert len(rows) == 1 and rows[0].modeled_s == 2.5e-4 and rows[0].gate == {"pearson": 0.9999}


def test_save_is_atomic_json_and_loads_back_equal(tmp_path):
    reg = Registry([_row(gemv.Config(tile_m=t), 1e-4 * t, gate={"pearson": 0.99995}) for t in (2, 4, 8)])
    reg.add(RegistryRow("gemm", gemm.Shape(64, 64, 64), gemm.Config(), 1e-4, timing_key="abc"))
    path = reg.save(tmp_path / "sub" / "registry.json")
    assert [p.name for p in path.parent.iterdir()] == ["registry.json"]  # no temp file left behind
    data = json.loads(path.read_text())
    assert data["version"] == 1 and len(data["rows"]) == 4
    again = Registry.load(path)
    assert [r.to_dict() for r in again.rows()] == [r.to_dict() for r in reg.rows()]
    assert again.best("gemm", gemm.Shape(64, 64, 64)).timing_key == "abc"


def test_merge_brings_rows_of_another_deployment():
    ours = Registry([_row(gemv.Config(tile_m=8), 3e-4)])
    theirs = Registry([_row(gemv.Config(tile_m=16), 2e-4), _row(gemv.Config(tile_m=4), 1e-4, shape=gemv.Shape(8, 64))])
    ours.merge(theirs)
    assert len(ours) == 3
    assert ours.best("gemv", gemv.Shape(2048, 2048)).modeled_s == 2e-4


def test_missing_or_corrupt_files_are_handled_with_clear_errors(tmp_path):
    assert len(Registry.load(tmp_path / "none.json")) == 0
    with pytest.raises(ConfigError, match="does not exist"):
        Registry.load(tmp_path / "none.json", missing_ok=False)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read as JSON"):
        Registry.load(bad)
    bad.write_text(json.dumps({"version": 99, "rows": []}))
    with pytest.raises(ConfigError, match="not a version-1"):
        Registry.load(bad)
    bad.write_text(json.dumps({"version": 1, "rows": [{"family": "gemv"}]}))
    with pytest.raises(ConfigError, match="malformed"):
        Registry.load(bad)


def test_rows_need_a_positive_modeled_time():
    with pytest.raises(ConfigError):
        _row(gemv.Config(), 0.0)
