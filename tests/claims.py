"""What a catalogue mechanism's campaign claims: the bound of the privacy event its plan writes (privacy.json)."""

from __future__ import annotations

from collections.abc import Sequence

from dpaudit.campaign import plan, resolve
from dpaudit.config import CampaignConfig
from dpaudit.mechanisms.bounds import AnalyticBound, event_bound
from dpaudit.mechanisms.privacy import LayerShape


def analytic_bound(config: CampaignConfig, members: int, layers: Sequence[LayerShape]) -> AnalyticBound:
    """The analytic ε at ``config.delta`` of ``config``'s mechanism trained on ``members`` examples with ``layers``."""
    claimed = plan.claimed_privacy(resolve.mechanism(config), config, members, layers)
    return event_bound(claimed, config.delta)
