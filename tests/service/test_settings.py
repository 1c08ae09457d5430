"""Settings from flags and HETSERVE_* variables: typed, and the same after the round trip that
hands them to front-end processes (service/workers/frontends.py)."""

from __future__ import annotations

import re

import pytest

from service.setting_names import FLAGS, OTHER_VARIABLES, unknown_variables
from service.settings import ENV_PREFIX, Settings


def test_switches_and_optional_numbers_parse() -> None:
    settings = Settings.from_env({}, response_energy="off", power_budget_w="120.5")
    assert (settings.response_energy, settings.power_budget_w) == (False, 120.5)
    defaults = Settings.from_env({})
    assert (defaults.response_energy, defaults.power_budget_w) == (True, None)
    assert Settings.from_env({ENV_PREFIX + "RESPONSE_ENERGY": "1"}).response_energy is True


def test_settings_survive_the_hand_over_to_front_ends() -> None:
    for settings in (Settings(), Settings(power_budget_w=80.0, response_energy=False)):
        assert Settings.from_env(settings.to_env()) == settings


@pytest.mark.parametrize("field, raw, message", [
    ("response_energy", "maybe", "--response-energy (HETSERVE_RESPONSE_ENERGY): 'maybe' is not "
                                 "one of"),
    ("power_budget_w", "lots", "--power-budget-w (HETSERVE_POWER_BUDGET_W): 'lots' is not a "
                               "number"),
    ("grpc_port", "abc", "--port (HETSERVE_PORT): 'abc' is not an integer"),
])
def test_bad_values_name_the_setting(field: str, raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Settings.from_env({}, **{field: raw})


def test_variables_are_named_after_the_flags_and_the_fields() -> None:
    assert Settings.from_env({"HETSERVE_PORT": "9001"}).grpc_port == 9001
    assert Settings.from_env({"HETSERVE_GRPC_PORT": "9002"}).grpc_port == 9002  # field and Triton
    assert Settings.from_env({"HETSERVE_MODELS": "repo"}).model_repository.name == "repo"
    assert Settings.from_env({"HETSERVE_EXIT_TIMEOUT_SECS": "3"}).shutdown_grace_s == 3.0
    assert Settings.from_env({"HETSERVE_LOG_VERBOSE": "1"}).log_level == "DEBUG"
    assert Settings.from_env({"HETSERVE_LOG_VERBOSE": "0"}).log_level == "INFO"
    assert Settings.from_env({"HETSERVE_PORT": "9001"}, grpc_port="7").grpc_port == 7  # flag wins
    # the same value under two names is fine
    assert Settings.from_env({"HETSERVE_PORT": "5", "HETSERVE_GRPC_PORT": "5"}).grpc_port == 5


@pytest.mark.parametrize("environ, message", [
    ({"HETSERVE_PORT": "1", "HETSERVE_GRPC_PORT": "2"},
     "--port (HETSERVE_PORT): HETSERVE_GRPC_PORT='2' and HETSERVE_PORT='1' disagree"),
    ({"HETSERVE_LOG_VERBOSE": "x"}, "--log-level (HETSERVE_LOG_VERBOSE): 'x' is not a verbosity"),
    ({"HETSERVE_UNIX_SOCKET": "/a", "HETSERVE_SOCKET": "/b"}, "disagree"),
])
def test_bad_variables_name_the_flag_and_the_variable(environ: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Settings.from_env(environ)


def test_unknown_variables_get_a_line_each_with_the_closest_name() -> None:
    environ = {"HETSERVE_PROT": "1", "HETSERVE_ZZZ": "1", "HETSERVE_PORT": "1",
               "HETSERVE_GRPC_PORT": "1", "HETSERVE_TEST_ENGINE_CONTROL": "x", "PATH": "/bin",
               **{name: "x" for name in OTHER_VARIABLES}}
    assert unknown_variables(environ) == [
        "environment variable HETSERVE_PROT is not a hetserve setting; ignored (did you mean "
        "HETSERVE_PORT?)",
        "environment variable HETSERVE_ZZZ is not a hetserve setting; ignored"]


def test_every_field_has_one_flag() -> None:  # errors name a field by its flag
    assert sorted(FLAGS.values()) == sorted(Settings.docs())
