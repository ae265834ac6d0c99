"""Log verbosity from AIO_DEBUG_MODE (0 silent .. 4 everything), as the product docs define it."""

import logging
import os
import warnings

from .errors import UsageError

_LEVELS = {0: logging.CRITICAL + 10, 1: logging.ERROR, 2: logging.INFO, 3: logging.DEBUG, 4: logging.DEBUG}

logger = logging.getLogger("aio_examples")


def debug_mode(environ=None) -> int:
    """The AIO_DEBUG_MODE in effect; 2 when unset."""
    raw = (environ if environ is not None else os.environ).get("AIO_DEBUG_MODE", "").strip()
    if not raw:
        return 2
    if raw not in {"0", "1", "2", "3", "4"}:
        raise UsageError(f"AIO_DEBUG_MODE={raw!r} is invalid; accepted: 0, 1, 2, 3, 4")
    return int(raw)


def configure(mode: int | None = None) -> int:
    """Point the package logger at stderr at the level AIO_DEBUG_MODE asks for."""
    mode = debug_mode() if mode is None else mode
    logger.setLevel(_LEVELS[mode])
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[aio-examples] %(levelname)s: %(message)s"))
        logger.addHandler(handler)
    logger.propagate = False
    if mode >= 4:
        logging.getLogger("torch").setLevel(logging.DEBUG)
    if mode < 3:
        # Libraries warn about tracing and config details the user did not choose; show them from 3 on.
        warnings.simplefilter("ignore")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        apply_in_fork()             # transformers may be loaded already: a fork of the fork server's
        # torchao (imported by transformers when installed) logs that its CUDA-only kernels are missing.
        logging.getLogger("torchao").setLevel(logging.ERROR)
    return mode


def apply_in_fork() -> None:
    """In a process forked from a fork server (core/forkserver.py), whose transformers read TRANSFORMERS_VERBOSITY as
    it loaded there: this process's own, as transformers would have read it here."""
    import sys

    verbosity = os.environ.get("TRANSFORMERS_VERBOSITY", "").strip().lower()
    if "transformers" in sys.modules and verbosity:
        from transformers.utils import logging as hf_logging

        if verbosity in hf_logging.log_levels:
            hf_logging.set_verbosity(hf_logging.log_levels[verbosity])
