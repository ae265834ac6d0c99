"""No library the harness drives phones home from a machine it benchmarks.

OpenVINO (on import, and in model conversion) and NNCF send usage data to Google Analytics and count usage in
`~/intel/` unless the user ran `opt_in_out --opt_out` (a consent file, absent by default, counts as consent
for them). The harness declines for its own processes, in the process, without writing into the user's home:
`import aio_examples` answers their consent check "declined" before any of them is imported.
"""


def opt_out() -> None:
    """Decline OpenVINO's telemetry (conversion, NNCF) in this process; nothing to do when it is not installed."""
    try:
        from openvino_telemetry.utils import opt_in_checker
    except ImportError:
        return
    declined = opt_in_checker.ConsentCheckResult.DECLINED
    opt_in_checker.OptInChecker.check = lambda self, *args, **kwargs: declined
