"""Settings from flags and HETSERVE_* variables: typed, and the same after the round trip that
hands them to front-end processes (service/workers/frontends.py)."""

from __future__ import annotations

import pytest

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
    ("response_energy", "maybe", "response_energy: 'maybe' is not one of"),
    ("power_budget_w", "lots", "power_budget_w: 'lots' is not a number"),
])
def test_bad_values_name_the_setting(field: str, raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings.from_env({}, **{field: raw})
