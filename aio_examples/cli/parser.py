"""The command line's parser: every subcommand and its flags (a measurement's own flags: drivers/worker.py)."""

import argparse

from ..core.errors import PROG, UsageError
from ..drivers.worker import add_run_arguments, positive, split_items

ACCURACY_TOLERANCE_HELP = ("largest fall of a task metric that is not a regression, in points: METRIC=POINTS comma "
                           "list like top_1=0.3,map=1.0, or POINTS for every metric (default 0.5)")


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line, like every other input error."""

    def error(self, message):
        raise UsageError(message)


def ints(flag: str, smallest: int = 1):
    def parse(text):
        values = []
        for item in split_items(text, flag):
            try:
                values.append(int(item))
            except ValueError:
                values.append(smallest - 1)
        if min(values) < smallest:
            raise UsageError(f"{flag} {text!r} is invalid; accepted: a comma list of whole numbers >= {smallest}")
        return values
    return parse


def comma_list(flag: str):
    return lambda text: split_items(text, flag)


def _add_drivers(sub) -> None:
    """matrix, sweep and throughput: the commands that start a process per point."""
    mx = sub.add_parser("matrix", help="which model x backend x precision runs here (each in its own process)")
    mx.add_argument("--models", default=None, help="comma list (default: the whole zoo)")
    mx.add_argument("--backends", default=None, help="comma list (default: all)")
    mx.add_argument("--precisions", default=None, help="comma list (default: all)")
    mx.add_argument("--output", default="results/matrix", help="folder of the cells' records (resumes)")
    mx.add_argument("-t", "--threads", default=None)
    mx.add_argument("--point-timeout", type=positive("--point-timeout", float, "seconds > 0"), default=900.0,
                    help="seconds per model x backend x precision before its process is killed")
    mx.add_argument("--render-only", action="store_true", help="only render the records already in --output")
    mx.add_argument("--readme", default=None, help="also replace the support matrix between the markers of this Markdown file (docs/backends.md)")
    sw = sub.add_parser("sweep", help="every combination of the given axes, each point in its own bound process")
    sw.add_argument("models", nargs="*", help="zoo names (or in --config)")
    sw.add_argument("--config", default=None, help="a TOML file with the same keys (see sweeps/); flags override it")
    sw.add_argument("--backends", type=comma_list("--backends"), default=None, help="comma list (default aio)")
    sw.add_argument("--precisions", type=comma_list("--precisions"), default=None, help="comma list (default fp32)")
    sw.add_argument("--batch-sizes", type=ints("--batch-sizes"), default=None, help="comma list (default 1)")
    sw.add_argument("--threads", type=ints("--threads"), default=None,
                    help="comma list (default: powers of two up to the physical cores, plus that)")
    sw.add_argument("--allocators", type=comma_list("--allocators"), default=None,
                    help="comma list of default, tcmalloc, jemalloc, hugetlb (default: default)")
    sw.add_argument("--fpmath-modes", type=comma_list("--fpmath-modes"), default=None,
                    help="comma list of fp32's fast-math modes, strict, bf16, f16, each a point of its own (as run "
                         "--fpmath-mode; default strict)")
    sw.add_argument("--lru-cache-capacity", type=ints("--lru-cache-capacity"), default=None,
                    help="comma list of LRU_CACHE_CAPACITY values (oneDNN primitives torch keeps for reuse), each a "
                         "point of its own (default: as the environment has it)")
    sw.add_argument("--thp-mem-alloc", type=ints("--thp-mem-alloc", 0), default=None,
                    help="comma list of THP_MEM_ALLOC_ENABLE values, 0 and/or 1 (torch's large CPU allocations on "
                         "transparent huge pages), each a point of its own (default: as the environment has it)")
    sw.add_argument("--input-size", type=positive("--input-size"), default=None)
    sw.add_argument("--seq-len", type=positive("--seq-len"), default=None)
    sw.add_argument("--seq-lens", type=ints("--seq-lens"), default=None,
                    help="comma list of sequence (prompt) lengths, each a point of its own (models with one)")
    sw.add_argument("--new-tokens", type=ints("--new-tokens"), default=None,
                    help="comma list of tokens to generate, each a point of its own (text generators)")
    sw.add_argument("--tune", choices=("quick", "thorough"), default=None,
                    help="aio's tuning where nothing is cached: quick (default) or thorough (as run --tune)")
    sw.add_argument("--input-shape", default=None,
                    help="your own model files' input shapes, NAME=DxDx...,... (as run --input-shape)")
    sw.add_argument("--input-dtype", default=None, help="your own model files' input dtypes (as run --input-dtype)")
    sw.add_argument("--config-override", action="append", default=None, metavar="KEY=VALUE",
                    help="change the architecture's config of every point (repeatable; see run --config-override)")
    sw.add_argument("--timeout", type=positive("--timeout", float, "seconds > 0"), default=None,
                    help="measured seconds per point (default 20)")
    sw.add_argument("--point-timeout", type=positive("--point-timeout", float, "seconds > 0"), default=None,
                    help="seconds before a point's process is killed (default 900)")
    sw.add_argument("--repeats", type=positive("--repeats"), default=None,
                    help="measure every point this many times, each in its own process (default 1)")
    sw.add_argument("--probe", action="store_true", default=None,
                    help="every point also reads the machine after each round (see run --probe)")
    sw.add_argument("--interleave", type=positive("--interleave"), default=None,
                    help="keep this many points' processes alive and let them take one-second turns, so each "
                         "point's passes come from moments spread over the sweep (default 1: one after another)")
    sw.add_argument("--num-samples", type=positive("--num-samples"), default=None,
                    help="samples of each dataset (the config's datasets table) scored per point (default: all)")
    sw.add_argument("--output", default=None, help="folder of results.jsonl; rerunning resumes (default results/sweep)")
    sw.add_argument("--quiet", action="store_true", help="no progress bar (also when CI=true)")
    sw.add_argument("--cluster", default=None, metavar="ADDRESS",
                    help="run every point on each machine kind of a Ray cluster: ray://HEAD:10001, HEAD:6379, or "
                         "local (a cluster on this machine); see docs/fleet.md")
    sw.add_argument("--nodes", default=None, metavar="LABEL=VALUE",
                    help="with --cluster: only nodes with this label value or custom resource (comma list: any)")
    sw.add_argument("--points-per-node", type=positive("--points-per-node"), default=None,
                    help="with --cluster: points run at once on a node, each on its own share of its cores (default 1)")
    tp = sub.add_parser("throughput", help="N instances x T threads on disjoint cores, throughput summed")
    tp.add_argument("model")
    tp.add_argument("--instances", type=positive("--instances"), default=2)
    tp.add_argument("--threads-per-instance", type=positive("--threads-per-instance"), default=1)
    tp.add_argument("-b", "--batch-size", type=positive("-b/--batch-size"), default=1)
    tp.add_argument("--backend", default="aio")
    tp.add_argument("-p", "--precision", default="fp32")
    tp.add_argument("--allocator", default="default", help="default, tcmalloc, jemalloc or hugetlb")
    tp.add_argument("--timeout", type=positive("--timeout", float, "seconds > 0"), default=20.0,
                    help="seconds of the common measurement window (default 20)")
    tp.add_argument("--input-size", type=positive("--input-size"), default=None)
    tp.add_argument("--seq-len", type=positive("--seq-len"), default=None)
    tp.add_argument("--output", default="results", help="folder for results.jsonl (default ./results)")


def _instances(text: str):
    return "auto" if text == "auto" else positive("--instances", accepted="a whole number >= 1, or auto")(text)


def _add_loadgen(sub) -> None:
    """loadgen: serving scenarios under MLPerf LoadGen."""
    from ..drivers.loadgen import MODES, QUICK_DURATION_S, SCENARIOS

    lg = sub.add_parser("loadgen", help="serving scenarios under MLPerf LoadGen: SingleStream, MultiStream, Offline, "
                                        "Server (and its peak rate under a latency bound)")
    lg.add_argument("model")
    lg.add_argument("--scenario", required=True, help=f"one of {', '.join(SCENARIOS)}")
    lg.add_argument("--mode", default="performance", help=f"one of {', '.join(MODES)} (default performance)")
    lg.add_argument("--backend", default="aio")
    lg.add_argument("-p", "--precision", default="fp32")
    lg.add_argument("-b", "--batch-size", type=positive("-b/--batch-size"), default=1,
                    help="samples an instance runs in one pass (Offline, MultiStream; Server: a dynamic batch)")
    lg.add_argument("--instances", type=_instances, default=1,
                    help="instance processes, each bound to its own cores (default 1); auto with --find-peak: "
                         "the layout of the cores with the highest valid Server rate")
    lg.add_argument("--threads-per-instance", type=positive("--threads-per-instance"), default=None,
                    help="default: the physical cores / instances")
    lg.add_argument("--target-qps", type=float, default=None, help="Server: the Poisson arrival rate (queries/s)")
    lg.add_argument("--latency-ms", type=float, default=None, help="Server: the p99 latency bound (default 100)")
    lg.add_argument("--ttft-ms", type=float, default=None,
                    help="text generators: the p99 bound on time to first token (MLPerf's LLM rule)")
    lg.add_argument("--tpot-ms", type=float, default=None,
                    help="text generators: the p99 bound on time per output token")
    lg.add_argument("--new-tokens", type=positive("--new-tokens"), default=None, help="tokens to generate")
    lg.add_argument("--find-peak", action="store_true",
                    help="Server: the highest rate LoadGen judges VALID under --latency-ms (runs Offline first)")
    lg.add_argument("--duration", type=float, default=QUICK_DURATION_S,
                    help=f"minimum seconds of each LoadGen test (default {QUICK_DURATION_S:g})")
    lg.add_argument("--min-queries", type=positive("--min-queries"), default=None,
                    help="minimum queries (default: what LoadGen's early stopping needs for the scenario)")
    lg.add_argument("--batch-timeout-ms", type=float, default=5.0,
                    help="Server with -b > 1: how long a batch waits to fill (default 5)")
    lg.add_argument("--official", action="store_true",
                    help="LoadGen's MLPerf settings (its built-in mlperf.conf: 10 minutes, fixed seeds)")
    lg.add_argument("--dataset", default=None,
                    help="KIND:PATH of a labelled dataset: --mode accuracy scores the served answers on it "
                         "(default: the kind's environment variables)")
    lg.add_argument("--labels", default=None, help="the dataset's labels or annotation file (imagenet, coco)")
    lg.add_argument("--weights", default=None, help="a local torchvision/PyTorch state-dict file")
    lg.add_argument("--model-dir", default=None, help="a local Hugging Face model folder (with tokenizer)")
    lg.add_argument("--num-samples", type=positive("--num-samples"), default=None,
                    help="only the first N samples of the dataset")
    lg.add_argument("--allocator", default="default", help="default, tcmalloc, jemalloc or hugetlb")
    lg.add_argument("--input-size", type=positive("--input-size"), default=None)
    lg.add_argument("--seq-len", type=positive("--seq-len"), default=None)
    lg.add_argument("--config-override", action="append", default=None, metavar="KEY=VALUE")
    lg.add_argument("--output", default="results", help="folder for results.jsonl and loadgen/ logs (default ./results)")
    lg.add_argument("--point-id", default=None, help=argparse.SUPPRESS)      # a sweep's point (drivers/sweep.py)


def _add_reports(sub) -> None:
    """peak and report."""
    pk = sub.add_parser("peak", help="this machine's matrix-multiply peak per precision and threads, and its memory "
                                     "bandwidth per threads (cached)")
    pk.add_argument("--precisions", type=comma_list("--precisions"), default=["fp32", "bf16", "int8"],
                    help="comma list of fp32, bf16, int8 (int8: integer ops, counted like FLOPs)")
    pk.add_argument("--threads", type=ints("--threads"), default=None,
                    help="comma list (default: powers of two up to the physical cores, plus that)")
    pk.add_argument("--only", choices=("gemm", "bandwidth"), default=None,
                    help="measure only the GEMM peak or only the memory bandwidth (default: both)")
    rp = sub.add_parser("report", help="report.html, summary.csv/md and plots from result files or folders")
    rp.add_argument("results", nargs="+", help="results.jsonl files or folders holding them")
    rp.add_argument("--output", default="report", help="folder to write into (default ./report)")
    rp.add_argument("--include-contended", action="store_true",
                    help="keep configurations measured while other processes held their cores in the suite view "
                         "and its geometric means (they are marked either way)")
    rp.add_argument("--prices", default=None,
                    help="TOML file of prices per hour per machine (machine_type or fingerprint): adds the cost per "
                         "million inferences and the cheapest machine per model (docs/fleet.md)")
    rp.add_argument("--latency-ms", type=positive("--latency-ms", float, "a number of milliseconds > 0"), default=None,
                    help="p99 latency bound of the best configuration per machine (default: no bound)")


def _add_analysis(sub) -> None:
    """compare, history and nightly: the commands over stored runs."""
    history_help = "the history database (default results/history.sqlite, or AIO_HISTORY)"
    cp = sub.add_parser("compare", help="what got slower between two runs (exit 1 on a regression)")
    cp.add_argument("baseline", help="results folder or file, or history:ID / history:latest")
    cp.add_argument("new", help="results folder or file, or history:ID / history:latest")
    cp.add_argument("--threshold", default="5%", help="smallest change that matters (default 5%%)")
    cp.add_argument("--confidence", type=float, default=0.95, help="level of the intervals (default 0.95)")
    cp.add_argument("--accuracy-tolerance", default=None, help=ACCURACY_TOLERANCE_HELP)
    cp.add_argument("--format", default="md", help="md (default), html or json")
    cp.add_argument("--output", default=None, help="write to this file instead of printing")
    cp.add_argument("--ignore", default=None,
                    help="comma list of fields left out of matching: threads, batch_size, instances, allocator, "
                         "shape, machine, fpmath (strict against fast math), env_axes")
    cp.add_argument("--history", default=None, help=history_help)
    hp = sub.add_parser("history", help="the history store of runs: add, list, show")
    hsub = hp.add_subparsers(dest="action", required=True, parser_class=Parser)
    ha = hsub.add_parser("add", help="store a run's records")
    ha.add_argument("results", help="results folder or results.jsonl")
    ha.add_argument("--label", default=None)
    hl = hsub.add_parser("list", help="the stored runs")
    hs = hsub.add_parser("show", help="trend of a model's configurations: table and plot")
    hs.add_argument("model")
    hs.add_argument("--backend", default=None)
    hs.add_argument("-p", "--precision", default=None)
    hs.add_argument("-b", "--batch-size", type=positive("-b/--batch-size"), default=None)
    hs.add_argument("-t", "--threads", type=positive("-t/--threads"), default=None)
    hs.add_argument("--format", choices=("table", "csv", "json"), default="table")
    hs.add_argument("--plot", default=None, help="PNG to write (default history-<model>.png beside the database)")
    for p in (ha, hl, hs):
        p.add_argument("--history", default=None, help=history_help)
    nt = sub.add_parser("nightly", help="store a run, compare it with its baseline, write the regression report")
    nt.add_argument("results", help="the run's results folder")
    nt.add_argument("--baseline", default=None,
                    help="results folder/file or history:ID (default: the latest earlier run on this machine)")
    nt.add_argument("--threshold", default="5%", help="smallest change that matters (default 5%%)")
    nt.add_argument("--accuracy-tolerance", default=None, help=ACCURACY_TOLERANCE_HELP)
    nt.add_argument("--output", default=None, help="folder for regression.md/html/json (default RESULTS/regression)")
    nt.add_argument("--history", default=None, help=history_help)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Benchmark CPU inference with PyTorch across backends and precisions.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    run_p = sub.add_parser("run", help="measure one model")
    run_p.add_argument("model", nargs="?", help="a zoo name (or --model-file)")
    add_run_arguments(run_p)
    prof = sub.add_parser("profile", help="measure one model and profile each configuration (run --profile): "
                                          "time per op category and the top ops, eager against compiled")
    prof.add_argument("model")
    add_run_arguments(prof)
    prof.add_argument("--backends", dest="backend", default=None, help="comma list (same as --backend)")
    list_p = sub.add_parser("list", help="the model zoo with task, input shape and FLOPs")
    list_p.add_argument("--no-flops", action="store_true", help="skip counting FLOPs (counted once, then cached)")
    list_p.add_argument("--json", action="store_true")
    sub.add_parser("setup", help="check (and adapt) the installed libraries")
    for add in (_add_drivers, _add_loadgen, _add_reports, _add_analysis):
        add(sub)
    return parser
