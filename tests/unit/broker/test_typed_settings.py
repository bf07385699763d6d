"""The typed view of the broker settings (``BrokerConfig.settings``) covers the SETTINGS table."""

from __future__ import annotations

import dataclasses
import typing

from ads_broker.config import SETTINGS, BrokerConfig, BrokerSettings, attribute_name


def test_every_setting_has_a_typed_attribute_of_its_parsed_type() -> None:
    hints = typing.get_type_hints(BrokerSettings)
    fields = {f.name for f in dataclasses.fields(BrokerSettings)}
    assert fields == {attribute_name(s.name) for s in SETTINGS}, "add the new setting to BrokerSettings"
    settings = BrokerConfig.load().settings
    for setting in SETTINGS:
        value = getattr(settings, attribute_name(setting.name))
        assert isinstance(value, hints[attribute_name(setting.name)]), setting.name


def test_the_typed_view_holds_the_validated_values() -> None:
    config = BrokerConfig.load(overrides={"num.partitions": "7", "log.cleaner.enable": "false",
                                          "log.cleaner.io.max.bytes.per.second": "1000"})
    assert config.settings.num_partitions == 7 == config["num.partitions"]
    assert config.settings.log_cleaner_enable is False
    assert config.settings.log_cleaner_io_max_bytes_per_second == 1000.0
    assert config.settings.advertised_listeners == config.settings.listeners  # defaults to listeners
