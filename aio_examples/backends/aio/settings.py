"""aio's settings: the strategies it weighs, the knobs it tries, its tuning stages' budgets and margins, and the
`AIO_*` variables that turn each stage on or off. The other modules of the package read these constants at call
time (`settings.STRATEGIES`), so that a test may patch them here."""

import os

from ...core.errors import UsageError
from ..base import onnx_source

STRATEGIES = ("compiled", "onnxruntime", "openvino")
# A generation step runs on neither runtime (they cannot step a mutable KV cache); beside its own compiled
# path, aio weighs inductor's, which lowers torchao's weight-only int8 to its packed kernel where aio's
# constant folding does not, and eager's: torchao's int4 CPU kernel decoded a 4-layer Llama 3.2 1B faster
# uncompiled (99.5 against inductor's 76.7 tokens/s here).
# The LLM engines run their own loops over their own formats of the same weights (llama.cpp's Q4_0 is not
# torchao's int4: the record's precision_mode says which ran). They go first: their weights take the least
# memory (a GGUF file another configuration maps is shared), and a strategy that no longer fits is not
# tried. Eager last: it takes the model handed in.
GENERATION_STRATEGIES = ("llama_cpp", "onnxruntime_genai", "openvino_genai", "compiled", "inductor", "eager")


def strategies_for(model, engines: dict | None = None) -> tuple:
    """The strategies this model may run on; an engine strategy only where its engine was handed in and is
    installed (an LLM engine not built here is no strategy, and the tuning key says so)."""
    from ..int8 import is_generation_step

    names = GENERATION_STRATEGIES if is_generation_step(model) else STRATEGIES
    if onnx_source(model) is not None:      # a graph for the runtimes only
        names = tuple(s for s in names if s in ("onnxruntime", "openvino"))
    if engines is None:
        return names
    return tuple(s for s in names if s == "compiled" or (s in engines and engines[s].unavailable_reason() is None))


# Settings tried on the chosen strategy beyond its defaults, one at a time, each on a preparation of its own
# timed against the settings kept so far (interleaved, in quiet rounds): kept only when faster beyond noise,
# so one that does not help on this machine and model costs tuning time and nothing else. A backend honours
# those it knows (PrepareContext.knobs); what each did is in backend_info.tuning.knobs.
KNOBS = {
    # inductor: kernels called from generated C++ rather than Python (per-pass overhead of small graphs);
    # GEMMs from autotuned C++ templates (AMX/AVX-512 microkernels); a conv net in its default layout
    "compiled": (("cpp_wrapper", True), ("max_autotune", True), ("channels_last", False)),
    # ONNX Runtime: idle intra-op threads sleep instead of spinning; no NCHWc layout transformation; parallel
    # loops handed out in shrinking blocks (ORT's suggested 4), which evens out the threads' shares; inputs
    # bound once through an IOBinding rather than fed anew on every pass
    "onnxruntime": (("allow_spinning", False), ("graph_optimization", "extended"), ("dynamic_block_base", 4),
                    ("io_binding", True)),
    # OpenVINO: threads not pinned to cores; denormals flushed to zero; at int8, what NNCF left in floating
    # point run bf16 where the CPU has it (the output check at int8's tolerance still decides); inputs bound
    # to the infer request once (zero copy) rather than wrapped on every pass, which small models notice
    "openvino": (("cpu_pinning", False), ("denormals_optimization", True), ("int8_mixed_bf16", True),
                 ("io_binding", True)),
}
# Engines taking turns in one pass must not keep spinning on the cores the next one needs: ONNX Runtime's idle
# intra-op threads spin by default (they then held both cores while OpenVINO ran the next segment, and a split
# of four engine-wise faster segments ran 1.9x slower than one engine). Applied to every segment they run.
SPLIT_KNOBS = {"onnxruntime": {"allow_spinning": False}}
KNOB_BUDGET_S = 180.0       # seconds of knob trials (preparing and timing) before the rest are left untried
KNOB_MIN_GAIN = 0.01        # a knob is kept when it is this much faster, beyond noise: not for a tie split finely


def _switch(name: str, what: str, off: str = "") -> bool:
    """An on/off variable: 1 (the default, `what`) or 0 (`off`, where said)."""
    on = os.environ.get(name, "1").strip()
    if on not in ("0", "1"):
        raise UsageError(f"{name}={on!r} is invalid; accepted: 1 ({what}, the default) or 0"
                         + (f" ({off})" if off else ""))
    return on == "1"


def _stage_settings(switch: str, budget_var: str, default_budget: float, what: str) -> tuple[bool, float]:
    """A tuning stage's on/off variable (1, the default, or 0) and its budget variable (seconds >= 0)."""
    on = _switch(switch, what)
    raw = os.environ.get(budget_var, str(default_budget)).strip()
    try:
        budget = float(raw)
    except ValueError:
        budget = -1.0
    if not budget >= 0:
        raise UsageError(f"{budget_var}={raw!r} is invalid; accepted: seconds, a number >= 0")
    return on, budget


def knob_settings() -> tuple[bool, float]:
    """`AIO_TUNE_KNOBS` (1, the default: try KNOBS on the chosen strategy; 0: its defaults only) and
    `AIO_KNOB_BUDGET_S` (seconds, default 180)."""
    return _stage_settings("AIO_TUNE_KNOBS", "AIO_KNOB_BUDGET_S", KNOB_BUDGET_S, "try the knobs")


SPLIT_BUDGET_S = 240.0      # seconds of the split stage (preparing each segment on each engine, timing)


def split_settings() -> tuple[bool, float]:
    """`AIO_TUNE_SPLIT` (1, the default: try running each segment of the graph on the engine fastest on it;
    0: whole models only) and `AIO_SPLIT_BUDGET_S` (seconds, default 240)."""
    return _stage_settings("AIO_TUNE_SPLIT", "AIO_SPLIT_BUDGET_S", SPLIT_BUDGET_S, "try splitting")


def rows_setting() -> bool:
    """`AIO_TUNE_ROWS` (1, the default: try the model computing only the rows its output reads; 0: as built)."""
    return _switch("AIO_TUNE_ROWS", "try computing only the rows read")


def huge_pages_setting() -> bool:
    """`AIO_HUGE_PAGES` (1, the default: back the memory aio's engines allocate with huge pages,
    backends/hugepages.py; 0: leave it in the pages it was given)."""
    return _switch("AIO_HUGE_PAGES", "back what aio prepares with huge pages", "leave its pages as allocated")


TUNE_MODES = ("quick", "thorough")
# Seconds a quick tuning spends preparing strategies: the first answer of a fresh machine comes in about a minute
# and a half (the model built, this tuning, the measurement). A strategy not started by then is left for
# `--tune thorough`; the engines that are cheapest to prepare and most often fastest go first.
QUICK_BUDGET_S = 30.0
# A generation step: the LLM engines first (their own formats, most often the fastest), then aio's own compiled
# path; inductor, the slowest to compile and seldom ahead of it, last, so a slow machine's budget leaves it out
# rather than the compiled path.
QUICK_ORDER = ("openvino", "onnxruntime", "llama_cpp", "openvino_genai", "compiled", "onnxruntime_genai", "eager",
               "inductor")
# At fp32 the runtimes' own kernels beat the compiled graph in every thorough tuning of docs/aio-performance.md's
# table (the graph wins at bf16): a quick fp32 tuning that has a runtime prepared leaves these out, and with them
# the longest preparation (resnet_50_v1's compile: about 40 s of a 2-core machine's first answer).
QUICK_RUNTIMES = tuple(s for s in STRATEGIES if s != "compiled")     # STRATEGIES' runtimes
QUICK_LEFT_TO_RUNTIMES = {"fp32": ("compiled", "inductor")}
# The knob a quick tuning tries on the strategy it chose, within its own budget: inputs bound once instead of fed
# on every pass, which small models notice (kept for mobilenet_v2 and efficientnet_b0 by thorough tunings here)
QUICK_KNOBS = ("io_binding",)
QUICK_KNOB_BUDGET_S = 20.0


def tune_setting() -> str:
    """`AIO_TUNE` (`--tune`): quick (the default: the strategies that fit QUICK_BUDGET_S, whole models with the
    QUICK_KNOBS tried on the choice, and the rows stage while the budget lasts; cached, and replaced by a thorough
    decision once one exists) or thorough (every strategy, then the knob, rows and split stages)."""
    mode = os.environ.get("AIO_TUNE", "quick").strip()
    if mode not in TUNE_MODES:
        raise UsageError(f"AIO_TUNE={mode!r} is invalid; accepted: {' or '.join(TUNE_MODES)} (--tune)")
    return mode


def process_mode() -> bool:
    """`AIO_PROCESS_MODE`: 1 (default) runs the optimized backend, 0 falls back to eager."""
    return _switch("AIO_PROCESS_MODE", "run the optimized backend", "fall back to eager")


FINALIST_MARGIN = 0.05      # strategies within this of the fastest take their own knob and rows stages too


# Engines this close in the decision's timing are raced again in each process that runs a cached decision: on a
# shared machine their order changes from one process to the next (mobilenet_v2 fp32 here: OpenVINO 4.3-7.3 ms,
# ONNX Runtime 4.2-8.8 ms alone in successive processes), so only the process that runs them can tell.
RACE_MARGIN = 0.25


def race_setting() -> bool:
    """`AIO_RACE_CLOSE` (1, the default: race engines within RACE_MARGIN again when a cached decision is run;
    0: run the decision's strategy)."""
    return _switch("AIO_RACE_CLOSE", "race close engines again in this process", "run the cached decision")


def switch_setting() -> bool:
    """`AIO_SWITCH` (1, the default: keep every engine raced and run the fastest of them at each moment,
    backends/switching.py; 0: run the race's winner throughout)."""
    return _switch("AIO_SWITCH", "switch among close engines at run time", "run the race's winner")
