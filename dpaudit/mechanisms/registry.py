"""Mechanism names of the CLI (``--mechanism``) → mechanism objects."""

from __future__ import annotations

from dpaudit.config import CampaignConfig
from dpaudit.mechanisms.base import Mechanism
from dpaudit.mechanisms.nonprivate import NonPrivate, lora_fa


def build(config: CampaignConfig) -> Mechanism:
    if config.mechanism == "none":
        return NonPrivate()
    if config.mechanism == "lora-fa":
        return lora_fa()
    raise AssertionError(f"CampaignConfig accepted an unregistered mechanism {config.mechanism!r}")
