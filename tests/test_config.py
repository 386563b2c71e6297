"""`strata.config`: precedence flag > environment > release default > built-in, in one place."""

from __future__ import annotations

import pytest

from strata import config
from strata.config import ConfigError, resolve


def test_flag_beats_environment_beats_release_default_beats_built_in():
    tuning = {"adapt_swaps": 700, "expert_cache": "auto"}
    env = {"STRATA_ADAPT_SWAPS": "12"}
    assert resolve({}, {}).adapt_swaps == 96
    cfg = resolve({}, {}, tuning)
    assert (cfg.adapt_swaps, cfg.expert_cache) == (700, "auto")
    assert "adapt_swaps" not in cfg.explicit  # a release default is not the user's choice
    assert resolve({}, env, tuning).adapt_swaps == 12
    assert resolve({"adapt_swaps": 3}, env, tuning).adapt_swaps == 3


def test_a_bad_variable_is_refused_in_one_line_naming_it():
    with pytest.raises(ConfigError, match="STRATA_PRIMARY_DEVICE='x' is not a valid int"):
        resolve({}, {"STRATA_PRIMARY_DEVICE": "x"})
    with pytest.raises(ConfigError, match="--primary-device must be >= 0"):
        resolve({"primary_device": -1}, {})


def test_environ_holds_only_the_settings_strata_reads(monkeypatch):
    monkeypatch.setenv("STRATA_CTX", "512")
    monkeypatch.setenv("STRATA_HOST_DENSE", "float")  # removed: never read
    got = config.environ()
    assert got["STRATA_CTX"] == "512" and "STRATA_HOST_DENSE" not in got


def test_at_most_thirty_three_strata_names():
    # 31 since STRATA_HELPER_CACHE (#53): run.sh hands the engine its config only as STRATA_*
    # lines, natively and in the container, so a helper card needs one name there
    assert len(set(config.NAMES)) == len(config.NAMES) <= 33


NUMERIC = [var for var, parse in config.ENV.values() if parse in (int, config.number)]


@pytest.mark.parametrize("raw", ["abc", "nan", "inf", "1.5.2", "0x"])
@pytest.mark.parametrize("var", NUMERIC)
def test_a_malformed_number_in_any_variable_is_one_line_naming_it(var, raw):
    with pytest.raises(ConfigError) as e:
        resolve({}, {var: raw})
    msg = str(e.value)
    assert msg.startswith(f"{var}={raw!r} is not a valid") and "\n" not in msg


@pytest.mark.parametrize("raw", ["abc", "nan", "-inf", "-1"])
def test_a_malformed_disk_floor_is_one_line_naming_the_variable(raw, capsys, monkeypatch):
    from strata.cli.main import main

    with pytest.raises(ConfigError, match=f"STRATA_DISK_FLOOR_GB={raw!r}"):
        config.resolve_launch(env={"STRATA_DISK_FLOOR_GB": raw})
    monkeypatch.setenv("STRATA_DISK_FLOOR_GB", raw)
    assert main(["resolve", "--release", "swift"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("strata: error: STRATA_DISK_FLOOR_GB=") and err.count("\n") == 1


def test_a_non_finite_float_flag_is_refused():
    with pytest.raises(ConfigError, match="finite"):
        resolve({"car_free_ratio": float("nan")}, {})


def test_helper_cache_refuses_the_primary_and_malformed_entries():
    with pytest.raises(ConfigError, match="the primary device"):
        resolve({"helper_cache": "0=auto"}, {})
    with pytest.raises(ConfigError, match="DEVICE=auto or DEVICE=SLOTS"):
        resolve({"helper_cache": "1=lots"}, {})
    with pytest.raises(ConfigError, match="twice"):
        resolve({"helper_cache": "1=4,1=auto"}, {})
    assert resolve({"helper_cache": "1=auto, 2=3400"}, {}).helper_cache == "1=auto, 2=3400"
