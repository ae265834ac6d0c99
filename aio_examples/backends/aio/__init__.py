"""The `aio` backend: the fastest of several strategies on this machine, chosen by a short tuning run and cached
(backend.py), and the `AIO_*` settings the command line checks before it starts."""

from .backend import (
    GENERATION_STRATEGIES,
    STRATEGIES,
    TUNE_MODES,
    AioBackend,
    huge_pages_setting,
    knob_settings,
    process_mode,
    race_setting,
    rows_setting,
    split_settings,
    strategies_for,
    switch_setting,
    tune_setting,
)

__all__ = ["GENERATION_STRATEGIES", "STRATEGIES", "TUNE_MODES", "AioBackend", "huge_pages_setting", "knob_settings",
           "process_mode", "race_setting", "rows_setting", "split_settings", "strategies_for", "switch_setting",
           "tune_setting"]
