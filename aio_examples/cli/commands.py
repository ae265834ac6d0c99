"""The subcommands: each turns parsed flags into a call of the layer that does the work, and prints."""

import contextlib
import os
import sys
from pathlib import Path

from ..core.errors import UsageError
from ..drivers.worker import backends_setting, precisions_setting, split_items
from .parser import PROG

# A run whose configurations were measured but one of whose processes crashed or hung (its record says so).
EXIT_CRASHED = 3


def do_run(model: str, args) -> int:
    from ..core.processes import die_with_parent
    from ..core.records import check_output_dir
    from ..machine.binding import apply_in_child, unused_switches
    from ..machine.threads import export_thread_env, resolve_threads

    die_with_parent()                          # a point of a sweep, matrix or throughput run ends with its driver
    apply_in_child()                           # a driver's sched_setaffinity binding, before torch starts
    if getattr(args, "rounds", None) is None:       # a configuration's process: its run has said them
        for warning in unused_switches():
            print(f"{PROG}: warning: {warning}", file=sys.stderr)
    # Everything that can be checked without torch is checked first: bad input fails fast.
    if getattr(args, "tune", None):
        os.environ["AIO_TUNE"] = args.tune         # read by aio where it tunes: this process or a configuration's
    precisions = precisions_setting(args.precision)
    choice = resolve_threads(args.threads, allow_oversubscribe=args.allow_oversubscribe)
    export_thread_env(choice.threads)          # before torch starts its thread pools
    backends = backends_setting(args.backend)
    from ..drivers.worker import fpmath_setting, measures_inline

    inline = measures_inline(args, len(backends) * len(precisions))
    pairs = fpmath_setting(args.fpmath_mode, precisions, inline)        # (precision, fast-math mode) of each
    if not inline:          # each configuration's process forks from this server: its imports start now
        from ..core.forkserver import prestart

        prestart(dict(os.environ))
    from ..models import get_model, is_path

    if model is not None and is_path(model):          # a path where a zoo name goes: the file or folder it names
        flag = "--model-dir" if Path(model).is_dir() else "--model-file"
        if getattr(args, flag[2:].replace("-", "_"), None):
            raise UsageError(f"{model!r} and {flag} both name the model; accepted: one of them")
        setattr(args, flag[2:].replace("-", "_"), model)
        model = None
    own = None            # a user's model file: (module, example inputs)
    if getattr(args, "saved_module", None) or getattr(args, "model_file", None) or args.model_dir:
        from ..compat import before_user_code
        from ..machine.threads import apply_threads

        before_user_code()                          # as the caller that built or saved it had done
        apply_threads(choice.threads)               # a module's own code may run torch ops as it loads
    if getattr(args, "saved_module", None):        # benchmark(module) measuring it in a process of its own
        from ..models.custom import custom_spec, load_module

        own = load_module(args.saved_module)
        spec, args.batch_size, shape = custom_spec(*own)
    elif getattr(args, "model_file", None):
        if model is not None:
            raise UsageError(f"--model-file names the model itself; accepted: a zoo name ({model!r}) or "
                             "--model-file, not both")
        from ..models.files import load_model_file

        spec, module, inputs, args.batch_size, shape = load_model_file(args.model_file, args.input_shape,
                                                                       args.input_dtype, try_inputs=inline)
        own = (module, inputs)
    elif model is None and not args.model_dir:
        raise UsageError("no model given; accepted: a zoo name (aio-examples list), --model-file FILE or "
                         "--model-dir DIR")
    else:
        if model is None:
            from ..models.folders import folder_spec

            spec = folder_spec(args.model_dir).with_config(args.config_override)
        else:
            spec = get_model(model).with_config(args.config_override)
        shape = spec.shape(input_size=args.input_size, seq_len=args.seq_len, new_tokens=args.new_tokens)
    from ..datasets import resolve

    dataset = resolve(spec.task, args.dataset, args.labels, args.num_samples)   # read and checked before building
    if "aio" in backends:
        from ..aio_compile import resolve_options

        resolve_options()       # invalid AIO_* values: one line now, not after building the model
    out_dir = check_output_dir(args.output)

    from ..core.records import format_table
    from ..drivers.worker import scenario_of
    from ..measurement.runner import RunRequest, run
    from ..measurement.timing import StopRule

    def request(backends_, precisions_, scenario=None, fpmath="strict"):
        return RunRequest(spec, backends_, precisions_, args.batch_size, choice, shape,
                          args.model_file if own else args.weights, args.model_dir,
                          StopRule(timeout_s=args.timeout, num_runs=args.num_runs), scenario=scenario,
                          point_id=args.point_id, probe=args.probe, dataset=dataset, profile=args.profile,
                          module=own[0] if own else None, example_inputs=own[1] if own else None, fpmath=fpmath)

    compare = len(backends) > 1 or len(pairs) > 1
    if inline:
        mode = next((m for _, m in pairs if m != "strict"), "strict")        # inline: one mode at most
        req = request(backends, precisions, scenario_of(args, spec.task), mode)
        results = run(req, out_dir, run_id=args.run_id, reference=compare)
    else:
        from ..core.records import new_run_id
        from ..drivers.launcher import Run, configs_of, run_configs
        from ..drivers.worker import config_argv

        for b in backends:            # each configuration checked alone, as its process will (memory, files)
            for p, m in pairs:
                request([b], [p], fpmath=m)
        configs = configs_of(spec, backends, precisions, args.batch_size, shape, reference=compare,
                             fpmath_modes=dict.fromkeys(m for _, m in pairs))
        results = run_configs(Run(config_argv(model, args), spec, args.batch_size, choice.threads, shape,
                                  new_run_id(), args.timeout), configs, out_dir)
    if args.json:
        for r in results:
            print(r.to_json())
    else:
        first = next((r for r in results if "threads_in_effect" in r.binding), results[0])   # one that ran
        print(f"\n{spec.name} ({spec.task}), input {first.input_shape}, weights: {first.weights}, "
              f"threads: {first.binding.get('threads_in_effect', choice.threads)} ({choice.source})")
        if compare:
            print("configurations were measured in interleaved rounds in a new order each round, "
                  "so machine drift affects all of them alike")
        print(format_table(results))
        if args.profile:
            from ..measurement.profile import table

            print(table(results))
        print(f"\nrecords appended to {out_dir / 'results.jsonl'}")
    if not any(r.status in ("ok", "fail_accuracy") for r in results):
        return 1
    return EXIT_CRASHED if any(r.status in ("crashed", "timeout") for r in results) else 0


def do_list(args) -> int:
    from ..models import ZOO

    rows = []
    for spec in ZOO.values():
        shape = spec.default_shape
        row = {"model": spec.name, "task": spec.task, "input": ", ".join(f"{k}={v}" for k, v in shape.items()),
               "unit": spec.task_unit}
        if not args.no_flops:
            from ..measurement.flops import cached_flops

            row["GFLOPs/pass (b=1)"] = f"{cached_flops(spec, shape) / 1e9:.2f}"
        rows.append(row)
    if args.json:
        import json

        for row in rows:
            print(json.dumps(row))
    else:
        import pandas as pd

        print(pd.DataFrame(rows).to_string(index=False))
    return 0


def do_setup(args) -> int:
    """Check the installation: torch, torchvision (adapting a CUDA wheel if needed), transformers."""
    import torch

    from ..compat.torchvision_shim import ensure_torchvision, torchvision_status

    ensure_torchvision()
    status = torchvision_status()
    print(f"torch {torch.__version__}, torchvision {status['torchvision']}: ops from {status['torchvision_ops']}"
          + (f" ({status['cuda_stub_symbols']} CUDA symbols stood in)" if status.get("cuda_stub_symbols") else ""))
    from ..models.nlp import load_transformers

    print(f"transformers {load_transformers().__version__}")
    return 0


def _names(arg: str | None, known, what: str) -> list[str]:
    if arg in (None, "all"):
        return list(known)
    names = split_items(arg, f"--{what}s")
    for n in names:
        if n not in known:
            raise UsageError(f"{what} {n!r} is unknown; accepted: {', '.join(known)}, all")
    return names


def do_matrix(args) -> int:
    """Run (or only render) the support matrix of models x backends x precisions."""
    from pathlib import Path

    from ..backends import BACKENDS
    from ..core.precision import PRECISIONS
    from ..core.records import check_output_dir, lock_output
    from ..drivers.matrix import render, run_matrix, update_readme
    from ..models import ZOO

    models = _names(args.models, ZOO, "model")
    backends = _names(args.backends, BACKENDS, "backend")
    precisions = _names(args.precisions, PRECISIONS, "precision")
    readme = Path(args.readme) if args.readme else None
    if readme is not None and not readme.is_file():
        raise UsageError(f"--readme {args.readme!r} is not a file; accepted: a Markdown file with support-matrix markers (docs/backends.md)")
    if args.render_only:
        out_dir = Path(args.output)
        if not (out_dir / "results.jsonl").is_file():      # nothing to render: never a table of dashes
            raise UsageError(f"--output {args.output!r} holds no matrix records to render; accepted: the folder "
                             "of an earlier 'aio-examples matrix' run")
    else:
        out_dir = check_output_dir(args.output)
        threads = None
        if args.threads is not None:
            from ..machine.threads import resolve_threads

            threads = resolve_threads(args.threads).threads
        with lock_output(out_dir, "a support matrix"):
            run_matrix(models, backends, precisions, out_dir, threads, args.point_timeout)
    from ..drivers.matrix import previous_cells

    # A matrix of some models only: the file's rows of the others stay
    previous = previous_cells(readme.read_text()) if readme is not None and args.models else None
    table = render(out_dir, models, backends, precisions, previous)
    print(table)
    (out_dir / "support_matrix.md").write_text(table)
    if readme is not None:
        try:
            update_readme(readme, table)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print(f"updated the support matrix in {readme}")
    return 0


def _shape_overrides(args) -> dict:
    """The shape flags the user gave (input size, sequence length, new tokens), for sweeps and instances."""
    from ..drivers.sweep import SHAPE_KEYS

    return {k: getattr(args, k) for k in SHAPE_KEYS if getattr(args, k, None) is not None}


def do_sweep(args) -> int:
    from ..drivers.sweep import SweepConfig, run_sweep

    shape = {k: v for k, v in _shape_overrides(args).items() if k != "new_tokens"}     # new tokens: a list axis
    overrides = {"models": args.models or None, "backends": args.backends, "precisions": args.precisions,
                 "batch_sizes": args.batch_sizes, "threads": args.threads, "allocators": args.allocators,
                 "fpmath_modes": args.fpmath_modes, "lru_cache_capacity": args.lru_cache_capacity,
                 "thp_mem_alloc": args.thp_mem_alloc,
                 "timeout": args.timeout, "point_timeout": args.point_timeout, "output": args.output,
                 "shape": shape or None, "seq_lens": args.seq_lens, "new_tokens": args.new_tokens,
                 "config_overrides": args.config_override, "repeats": args.repeats, "probe": args.probe or None,
                 "interleave": args.interleave, "num_samples": args.num_samples, "input_shape": args.input_shape,
                 "input_dtype": args.input_dtype, "tune": args.tune}
    if args.config:
        cfg = SweepConfig.from_toml(args.config, overrides)
    else:
        cfg = SweepConfig(**{k: v for k, v in overrides.items() if v is not None})
    if args.cluster is not None:
        from ..drivers.fleet import run_fleet

        if cfg.interleave > 1:
            raise UsageError(f"--interleave {cfg.interleave} does not apply to --cluster (a node runs its points one "
                             "at a time); accepted: --points-per-node for points side by side on a node")
        summary = run_fleet(cfg, args.cluster, args.nodes, args.points_per_node or 1, quiet=args.quiet)
    elif args.nodes is not None or args.points_per_node is not None:
        raise UsageError(f"--{'nodes' if args.nodes is not None else 'points-per-node'} applies to a sweep on a "
                         "cluster; accepted: with --cluster ADDRESS")
    else:
        summary = run_sweep(cfg, quiet=args.quiet)
    print(summary.text(Path(cfg.output)))
    if summary.interrupted:
        raise summary.interrupted
    return 0


def do_throughput(args) -> int:
    from ..backends import get_backend
    from ..core.precision import validate
    from ..core.records import check_output_dir, lock_output
    from ..drivers.instances import run_throughput
    from ..machine.allocators import validate as valid_allocator
    from ..machine.topology import numa_cpus_from_env
    from ..models import get_model

    get_model(args.model)
    validate(args.precision)
    get_backend(args.backend)
    valid_allocator(args.allocator)
    out = check_output_dir(args.output)
    shape = _shape_overrides(args)
    numa = numa_cpus_from_env()
    with lock_output(out, f"a throughput run of {args.model}"):
        records = run_throughput(args.model, args.backend, args.precision, args.batch_size, args.instances,
                                 args.threads_per_instance, args.timeout, out, shape, args.allocator, numa_cpus=numa)
    agg = records[-1]
    for r in records[:-1]:
        lat = r.latency_ms or {}
        print(f"instance {r.instance['index']}: cores {r.instance.get('cores')}, {r.status}"
              + (f", median {lat['median']:.2f} ms, {r.throughput['value']:.2f} {r.throughput['unit']}"
                 if r.status == "ok" else f": {r.reason}"))
        for warning in r.warnings:
            print(f"  warning: {warning}")
    if agg.status != "ok":
        print(f"throughput: {agg.status}: {agg.reason}")
        return 1
    print(f"{args.model} {args.backend} {args.precision} b{args.batch_size}: {args.instances} instance(s) x "
          f"{args.threads_per_instance} thread(s): {agg.throughput['value']:.2f} {agg.throughput['unit']} "
          f"(sum over the {agg.instance['window_s']:.1f} s all instances ran)")
    print(f"records appended to {out / 'results.jsonl'}")
    return 0


def do_loadgen(args) -> int:
    from ..backends import get_backend
    from ..core.precision import validate
    from ..core.records import check_output_dir, lock_output
    from ..drivers.loadgen import ServingSettings, Session, check_fits, find_peak
    from ..machine.allocators import validate as valid_allocator
    from ..machine.topology import numa_cpus_from_env, read_topology
    from ..models import get_model

    scenario = "Server" if args.find_peak and args.scenario == "Server" else args.scenario
    if args.find_peak and args.scenario != "Server":
        raise UsageError(f"--find-peak searches Server rates, not {args.scenario}; accepted: --scenario Server")
    settings = ServingSettings(scenario, args.mode, args.duration, args.min_queries,
                               None if args.find_peak else args.target_qps, args.latency_ms, args.batch_timeout_ms,
                               args.official, args.ttft_ms, args.tpot_ms) if not args.find_peak else None
    if args.find_peak:      # the same checks as a Server run's, at any rate
        ServingSettings("Server", args.mode, args.duration, args.min_queries, 1.0, args.latency_ms)
        if args.target_qps is not None:
            raise UsageError("--find-peak searches the rate itself; accepted: --target-qps or --find-peak, not both")
    spec = get_model(args.model).with_config(args.config_override)
    check_fits(spec, settings or ServingSettings("Server", target_qps=1.0, ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms),
               args.batch_size)
    validate(args.precision)
    get_backend(args.backend)
    valid_allocator(args.allocator)
    from ..datasets import resolve

    data = resolve(spec.task, args.dataset, args.labels, args.num_samples)    # read and checked before starting
    if args.mode == "accuracy" and not data.labelled:
        raise UsageError(f"--mode accuracy scores the served answers on a labelled dataset, and {args.model} has "
                         "none; accepted: --dataset KIND:PATH (or the kind's environment variable, docs/datasets.md)")
    run_flags = {"dataset": args.dataset, "labels": args.labels, "num_samples": args.num_samples,
                 "weights": args.weights, "model_dir": args.model_dir}
    topology = read_topology()
    cores = topology.physical_cores
    if args.instances == "auto":
        if not args.find_peak:
            raise UsageError("--instances auto searches the layout with the highest valid Server rate; accepted: "
                             "--instances auto with --scenario Server --find-peak")
        if args.threads_per_instance:
            raise UsageError("--instances auto tries every layout of the cores; accepted: no --threads-per-instance")
        layouts = topology.instance_layouts()
    else:
        layouts = [(args.instances, args.threads_per_instance or max(1, cores // args.instances))]
    out = check_output_dir(args.output)
    shape = _shape_overrides(args)
    # a sweep's point: the sweep holds the output folder already
    held = contextlib.nullcontext() if args.point_id else lock_output(out, f"a LoadGen run of {args.model}")
    records, peaks = [], []
    with held:
        for instances, threads in layouts:
            with Session(args.model, args.backend, args.precision, args.batch_size, instances, threads, out, shape,
                         args.allocator, numa_cpus_from_env(), args.config_override,
                         point_id=args.point_id if len(layouts) == 1 else None, run_flags=run_flags) as session:
                if args.find_peak:
                    peaks.append(((instances, threads), find_peak(session, args.latency_ms, args.duration,
                                                                  args.min_queries, args.official,
                                                                  ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms)))
                else:
                    session.run(settings)
            records += session.records
            for r in session.records:
                print(_loadgen_line(r))
            print(f"LoadGen's logs in {session.folder}")
    print(f"records appended to {out / 'results.jsonl'}")
    if peaks:
        found = [(p["peak_qps"], layout) for layout, p in peaks if p.get("peak_qps")]
        if len(layouts) > 1 and found:
            best, (n, t) = max(found)
            print(f"best layout: {n} instance(s) x {t} thread(s), {best:.2f} queries/s within "
                  f"{args.latency_ms or 100:g} ms at p99")
        return 0 if found else 1
    return 0 if all(r.status == "ok" for r in records) else 1


def _absorbs(lg: dict) -> str:
    """How many over-bound queries the run's query count allowed, in words."""
    n = lg.get("absorbable_misses")
    return "none: too few queries" if n is None else f"up to {n}"


def _loadgen_line(r) -> str:
    sc = r.scenario
    what = f"{r.model} {r.backend}/{r.precision} b{r.batch_size} {r.instances}x{r.threads}"
    if r.status != "ok":
        return f"{sc.get('scenario')} {what}: {r.status}: {r.reason}"
    lg = r.metrics.get("loadgen", {})
    if sc.get("key") == "loadgen-server-peak":
        tried = ", ".join(f"{x['target_qps']:g}/s {x['validity']}"
                          + (f" ({len(x['tries'])} tries)" if len(x.get("tries", ())) > 1 else "") for x in lg["runs"])
        return (f"peak Server rate under {lg['latency_bound_ms']:g} ms (p99): {lg['peak_qps']:.2f} queries/s "
                f"(Offline {lg['offline_qps']:.2f}/s; tried {tried})")
    lat, nan = lg.get("latency_ms", {}), float("nan")
    why = f" ({'; '.join(lg['reasons'])})" if lg.get("reasons") else ""
    if sc.get("mode") == "accuracy" and r.accuracy:          # the served answers, scored
        scored = ", ".join(f"{k} {v:.4f}" for k, v in r.accuracy["metrics"].items())
        return f"{sc['scenario']} accuracy {what}: {scored} over {r.accuracy['samples']} samples: {lg.get('validity')}{why}"
    if sc["scenario"] == "Offline":
        figure = f"{lg.get('samples_per_s') or 0:.2f} samples/s"
    elif sc["scenario"] == "Server" and "ttft_ms" in lg:       # a text generator: its token latencies
        figure = (f"{sc['target_qps']:g} queries/s offered, TTFT p99 {lg['ttft_ms'].get('p99', nan):.1f} ms "
                  f"(bound {sc['ttft_ms']:g}), TPOT p99 {lg['tpot_ms'].get('p99', nan):.1f} ms (bound "
                  f"{sc['tpot_ms']:g}), {lg.get('tokens_per_s') or 0:.1f} tokens/s")
    elif sc["scenario"] == "Server":
        figure = (f"{sc['target_qps']:g} queries/s offered, p99 {lat.get('p99', nan):.1f} ms "
                  f"(bound {sc['latency_ms']:g} ms), {lg.get('overlatency_queries', '?')} of {lg.get('queries')} "
                  f"queries over it (early stopping absorbs {_absorbs(lg)})")
    elif sc["scenario"] == "SingleStream":
        figure = f"p90 {lat.get('p90', nan):.2f} ms"
    else:
        figure = f"p99 {lat.get('p99', nan):.2f} ms per 8-sample query"
    return f"{sc['scenario']} {what}: {figure}: {lg.get('validity')}{why}"


def do_report(args) -> int:
    from ..reporting.report import build_report

    try:
        written = build_report(args.results, Path(args.output), include_contended=args.include_contended,
                               prices=args.prices, latency_ms=args.latency_ms)
    except OSError as exc:              # a full disk, a folder removed meanwhile: the report, not the records
        raise UsageError(f"--output {args.output!r}: the report could not be written ({exc.strerror or exc}); "
                         "accepted: a folder with room for it") from None
    print(f"{written['records']} records: {written['html']}, {written['md']}, {written['csv']} "
          f"(plots in {Path(args.output) / 'plots'})")
    if "fleet_md" in written:
        print(f"machines side by side: {written['fleet_md']}, {written['fleet_csv']}")
    for line in written.get("cheapest", []):
        print(line)
    return 0


def do_peak(args) -> int:
    from ..machine import peak
    from ..machine.topology import read_topology

    for precision in args.precisions:
        if precision not in peak.PEAK_PRECISIONS:
            raise UsageError(f"--precisions {precision!r} is not measured; accepted: {', '.join(peak.PEAK_PRECISIONS)}")
    topo = read_topology()
    threads = args.threads or topo.default_thread_counts()
    for t in threads:
        topo.pick_cpus(t)
    if args.only != "bandwidth":
        table = peak.measure_peaks(args.precisions, threads)
        print(f"matrix-multiply peak of this machine ({peak.SIZE}x{peak.SIZE} GEMM), GFLOP/s:")
        for precision, by_threads in table["peaks"].items():
            for t, entry in sorted(by_threads.items(), key=lambda kv: int(kv[0])):
                engines = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k}: {v}"
                                    for k, v in entry["engines"].items())
                best = f"{entry['gflops']:.1f} ({entry['engine']})" if entry["gflops"] else "none"
                print(f"  {precision} {t} thread(s): {best}   [{engines}]")
        print(f"cached for this machine: {peak.cache_path()}")
    if args.only != "gemm":
        from ..machine import bandwidth

        measured = bandwidth.measure_bandwidth(threads)
        sizes = {e["array_bytes"] for e in measured.values() if "array_bytes" in e}
        over = f"3 x {max(sizes) / 2**20:.0f} MiB {bandwidth.DTYPE} arrays" if sizes else "arrays"
        print(f"memory bandwidth of this machine (STREAM triad and read over {over}), GB/s:")
        for t, entry in measured.items():
            if "error" in entry:
                print(f"  {t} thread(s): none   [{entry['error']}]")
                continue
            busy = (f"   [other processes kept {entry['busy_elsewhere_cores']:.2f} cores busy: low figures]"
                    if entry["contended"] else "")
            print(f"  {t} thread(s): read {entry['read_gb_s']:.1f}, triad {entry['triad_gb_s']:.1f}   "
                  f"roofline: {entry['roofline_gb_s']:.1f} ({entry['roofline']}){busy}")
        print(f"cached for this machine: {peak.cache_path(bandwidth.KIND)}")
    return 0


def do_compare(args) -> int:
    from ..analysis import compare as cmp
    from ..analysis.history import load_run
    from ..reporting import regression

    threshold = cmp.parse_threshold(args.threshold)
    tolerance = cmp.parse_accuracy_tolerance(args.accuracy_tolerance)
    if args.output and not Path(args.output).parent.is_dir():
        raise UsageError(f"--output {args.output!r} is in a folder that does not exist; accepted: a file path in an "
                         "existing folder")
    regression.check_format(args.format)
    ignore = split_items(args.ignore, "--ignore") if args.ignore is not None else ()
    cmp.check_ignore(ignore)
    baseline, new = load_run(args.baseline, args.history), load_run(args.new, args.history)
    comparison = cmp.compare(baseline, new, threshold, args.confidence, ignore, accuracy_tolerance=tolerance)
    text = regression.render(comparison, args.format)
    if args.output:
        Path(args.output).write_text(text)
        print(regression.summary_line(comparison) + f" -> {args.output}")
    else:
        print(text)
    return comparison.exit_code


def do_history(args) -> int:
    from ..analysis.history import History, load_run
    from ..core.paths import safe_name
    from ..reporting.plots import plot_history

    if args.action == "add":
        run = load_run(args.results)
        with History.open(args.history) as h:
            run_id, fresh = h.add(run, label=args.label)
            print(f"{'stored' if fresh else 'already stored'}: {len(run.records)} records of {args.results} as "
                  f"history:{run_id} in {h.path}")
        return 0
    with History.open(args.history, create=False) as h:
        if args.action == "list":
            rows = h.runs()
            for r in rows:
                torch_v = r["versions"].get("torch", "?")
                print(f"history:{r['id']:<4} {r['started_at'] or '?':25} {r['records']:4} records  torch {torch_v}  "
                      f"git {(r['git_commit'] or '?')[:10]}  {r['machine_desc'] or '?'}  {r['label'] or r['source']}")
            print(f"{len(rows)} run(s) in {h.path}")
            return 0
        df, rows = h.trend(args.model, backend=args.backend, precision=args.precision, batch_size=args.batch_size,
                           threads=args.threads)
    if args.format == "json":
        print(df.to_json(orient="records", indent=1))
    elif args.format == "csv":
        print(df.to_csv(index=False), end="")
    else:
        import pandas as pd

        shown = df.drop(columns=["ci_low", "ci_high", "allocator"])
        shown["vs_previous"] = shown["vs_previous"].map(lambda v: "" if pd.isna(v) else f"{100 * v:+.1f}%")
        print(shown.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    plot = Path(args.plot) if args.plot else h.path.parent / f"history-{safe_name(args.model)}.png"
    title = f"{args.model}" + "".join(f", {k} {v}" for k, v in (("backend", args.backend), ("precision", args.precision),
                                                                ("batch", args.batch_size), ("threads", args.threads)) if v)
    print(f"trend plot: {plot_history(rows, title, plot)}")
    return 0


def do_nightly(args) -> int:
    from ..analysis.compare import parse_accuracy_tolerance, parse_threshold
    from ..reporting.nightly import nightly

    code, info = nightly(args.results, args.baseline, args.history, parse_threshold(args.threshold), args.output,
                         accuracy_tolerance=parse_accuracy_tolerance(args.accuracy_tolerance))
    print(f"stored as history:{info['run_id']} in {info['history']}" + ("" if info["stored"] else " (already there)"))
    if info["baseline"] is None:
        print(info["text"], end="")
        return code
    print(f"compared with {info['baseline']}: {info['summary']}; run-to-run spread from the history for "
          f"{info['noise_known']} configuration(s)")
    print(f"regression report: {info['md']}, {info['html']}, {info['json']}")
    if code:
        print("REGRESSION: see the report", file=sys.stderr)
    return code


COMMANDS = {"list": do_list, "matrix": do_matrix, "sweep": do_sweep, "throughput": do_throughput, "loadgen": do_loadgen,
            "report": do_report, "peak": do_peak, "setup": do_setup, "compare": do_compare,
            "history": do_history, "nightly": do_nightly}
