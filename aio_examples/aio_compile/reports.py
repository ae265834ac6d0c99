"""What the backend did to each model, kept per `modelname` so results can record it."""

import copy

_REPORTS: dict[str, dict] = {}
_OWNER: dict[str, object] = {}   # the options dict of the compile that made the report
_SETTINGS = ("options", "inductor")   # sections that describe the compile; the others count


def _add(total: dict, part: dict, count: bool = True) -> None:
    for key, value in part.items():
        if isinstance(value, dict):
            _add(total.setdefault(key, {}), value, count and key not in _SETTINGS)
        elif count and isinstance(value, int) and not isinstance(value, bool) and key in total:
            total[key] += value
        else:
            total[key] = value


def record(modelname: str, options: object, graph_report: dict) -> None:
    """Add one compiled graph's report.

    Graphs of one torch.compile call (graph breaks) arrive with the same `options` object and add up;
    a new call, or one without options, starts a new report.
    """
    if options is None or _OWNER.get(modelname) is not options or modelname not in _REPORTS:
        _REPORTS[modelname] = {"graphs": 0}
        _OWNER[modelname] = options
    report = _REPORTS[modelname]
    report["graphs"] += 1
    _add(report, graph_report)


def last_report(modelname: str) -> dict | None:
    """The report of the latest compile under `modelname` (a copy), None when there was none."""
    report = _REPORTS.get(modelname)
    return copy.deepcopy(report) if report is not None else None
