"""The version of dpaudit, recorded in every run directory (campaign.json) and checked on resume."""

__version__ = "0.1.0"
