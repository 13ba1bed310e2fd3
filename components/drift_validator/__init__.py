"""DriftValidator: this run's text profile against the latest blessed run's (TFDV)."""
