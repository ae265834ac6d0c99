"""The `aio` backend (backend.py), one module per stage of what it does, and the `AIO_*` settings the command line
checks before it starts (settings.py)."""

from .backend import AioBackend, AioTorchBackend
from .settings import (
    TUNE_MODES,
    huge_pages_setting,
    knob_settings,
    process_mode,
    race_setting,
    rows_setting,
    split_settings,
    switch_setting,
    tune_setting,
)

__all__ = ["TUNE_MODES", "AioBackend", "AioTorchBackend", "huge_pages_setting", "knob_settings", "process_mode", "race_setting",
           "rows_setting", "split_settings", "switch_setting", "tune_setting"]
