"""Command line: `aio-examples run|list|setup`, and the shared entry of every model's run.py.

Only this module turns errors into messages and exit codes (2 for bad input).
"""

import argparse
import sys
import traceback

from .errors import AioError, UsageError
from .log import configure

PROG = "aio-examples"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line, like every other input error."""

    def error(self, message):
        raise UsageError(message)


def _positive(flag, kind=int, accepted="a whole number >= 1"):
    """An argparse type: a number > 0 of `kind`, else a one-line usage error naming `flag`."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise UsageError(f"{flag} {text!r} is invalid; accepted: {accepted}")
        return value
    return parse


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of a measurement, shared by `aio-examples run` and every run.py."""
    from .backends import BACKENDS, DEFAULT_BACKEND
    from .precision import PRECISIONS

    p.add_argument("-p", "--precision", default="fp32",
                   help=f"one of {', '.join(PRECISIONS)}, a comma list, or 'all' (default fp32)")
    p.add_argument("-b", "--batch-size", type=_positive("-b/--batch-size"), default=1)
    p.add_argument("-t", "--threads", default=None,
                   help="threads (default: AIO_NUM_THREADS, else OMP_NUM_THREADS, else physical cores)")
    p.add_argument("--backend", default=None,
                   help=f"one of {', '.join(BACKENDS)}, a comma list, or 'all' (default: {DEFAULT_BACKEND})")
    p.add_argument("--timeout", type=_positive("--timeout", float, "a number of seconds > 0"), default=60.0,
                   help="seconds of measurement per configuration (default 60)")
    p.add_argument("--num-runs", type=_positive("--num-runs"), default=None,
                   help="measure exactly this many passes instead of stopping at the confidence target")
    p.add_argument("--output", default="results", help="folder for results.jsonl (default ./results)")
    p.add_argument("--input-size", type=_positive("--input-size"), default=None, help="image side (vision)")
    p.add_argument("--seq-len", type=_positive("--seq-len"), default=None, help="sequence length (NLP)")
    p.add_argument("--new-tokens", type=_positive("--new-tokens"), default=None,
                   help="tokens to generate (text generation)")
    p.add_argument("--weights", default=None, help="a local torchvision/PyTorch state-dict file")
    p.add_argument("--model-dir", default=None, help="a local Hugging Face model folder (with tokenizer)")
    p.add_argument("--allow-oversubscribe", action="store_true",
                   help="allow more threads than CPUs available to this process")
    p.add_argument("--json", action="store_true", help="print the records as JSON lines instead of a table")


def _backends(arg: str | None) -> list[str]:
    from .backends import DEFAULT_BACKEND, available_backends, get_backend
    from .backends.aio import process_mode

    if arg is None:
        names = [DEFAULT_BACKEND]
    elif arg == "all":
        names = available_backends()
    else:
        names = [n.strip() for n in arg.split(",") if n.strip()]
        for n in names:
            get_backend(n)
    if "aio" in names and not process_mode():
        print("AIO_PROCESS_MODE=0: the optimized backend is off, running eager instead", file=sys.stderr)
        names = list(dict.fromkeys("eager" if n == "aio" else n for n in names))
    return names


def _precisions(arg: str) -> list[str]:
    from .precision import PRECISIONS, validate

    if arg == "all":
        return list(PRECISIONS)
    return [validate(p.strip()) for p in arg.split(",") if p.strip()] or [validate(arg)]


def do_run(model: str, args) -> int:
    from .results import check_output_dir
    from .threads import export_thread_env, resolve_threads

    # Everything that can be checked without torch is checked first: bad input fails fast.
    precisions = _precisions(args.precision)
    choice = resolve_threads(args.threads, allow_oversubscribe=args.allow_oversubscribe)
    export_thread_env(choice.threads)          # before torch starts its thread pools
    from .models import get_model

    spec = get_model(model)
    shape = spec.shape(input_size=args.input_size, seq_len=args.seq_len, new_tokens=args.new_tokens)
    backends = _backends(args.backend)
    if "aio" in backends:
        from .aio_compile import resolve_options

        resolve_options()       # invalid AIO_* values: one line now, not after building the model
    out_dir = check_output_dir(args.output)

    from .results import format_table
    from .runner import RunRequest, run
    from .timing import StopRule

    req = RunRequest(spec, backends, precisions, args.batch_size, choice, shape, args.weights, args.model_dir,
                     StopRule(timeout_s=args.timeout, num_runs=args.num_runs))
    compare = len(backends) > 1 or len(precisions) > 1
    results = run(req, out_dir, reference=compare)
    if args.json:
        for r in results:
            print(r.to_json())
    else:
        first = results[0]
        print(f"\n{spec.name} ({spec.task}), input {first.input_shape}, weights: {first.weights}, "
              f"threads: {first.binding['threads_in_effect']} ({choice.source})")
        if compare:
            print("configurations were measured in interleaved rounds (A B C A B C ...), "
                  "so machine drift affects all of them alike")
        print(format_table(results))
        print(f"\nrecords appended to {out_dir / 'results.jsonl'}")
    return 0 if any(r.status in ("ok", "fail_accuracy") for r in results) else 1


def do_list(args) -> int:
    from .models import ZOO

    rows = []
    for spec in ZOO.values():
        shape = spec.default_shape
        row = {"model": spec.name, "task": spec.task, "input": ", ".join(f"{k}={v}" for k, v in shape.items()),
               "unit": spec.task_unit}
        if not args.no_flops:
            from .flops import cached_flops

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

    from .compat.torchvision_shim import ensure_torchvision, torchvision_status

    ensure_torchvision()
    status = torchvision_status()
    print(f"torch {torch.__version__}, torchvision {status['torchvision']}: ops from {status['torchvision_ops']}"
          + (f" ({status['cuda_stub_symbols']} CUDA symbols stood in)" if status.get("cuda_stub_symbols") else ""))
    from .models.nlp import _transformers

    print(f"transformers {_transformers().__version__}")
    return 0


def _names(arg: str | None, known, what: str) -> list[str]:
    if arg in (None, "all"):
        return list(known)
    names = [n.strip() for n in arg.split(",") if n.strip()]
    for n in names:
        if n not in known:
            raise UsageError(f"{what} {n!r} is unknown; accepted: {', '.join(known)}, all")
    return names


def do_matrix(args) -> int:
    """Run (or only render) the support matrix of models x backends x precisions."""
    from pathlib import Path

    from .backends import BACKENDS
    from .matrix import render, run_matrix, update_readme
    from .models import ZOO
    from .precision import PRECISIONS
    from .results import check_output_dir

    models = _names(args.models, ZOO, "model")
    backends = _names(args.backends, BACKENDS, "backend")
    precisions = _names(args.precisions, PRECISIONS, "precision")
    readme = Path(args.readme) if args.readme else None
    if readme is not None and not readme.is_file():
        raise UsageError(f"--readme {args.readme!r} is not a file; accepted: a README with support-matrix markers")
    out_dir = check_output_dir(args.output)
    if not args.render_only:
        threads = None
        if args.threads is not None:
            from .threads import resolve_threads

            threads = resolve_threads(args.threads).threads
        run_matrix(models, backends, precisions, out_dir, threads, args.point_timeout)
    table = render(out_dir, models, backends, precisions)
    print(table)
    (out_dir / "support_matrix.md").write_text(table)
    if readme is not None:
        try:
            update_readme(readme, table)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print(f"updated the support matrix in {readme}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Benchmark CPU inference with PyTorch across backends and precisions.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run_p = sub.add_parser("run", help="measure one model")
    run_p.add_argument("model")
    add_run_arguments(run_p)
    list_p = sub.add_parser("list", help="the model zoo with task, input shape and FLOPs")
    list_p.add_argument("--no-flops", action="store_true", help="skip counting FLOPs (counted once, then cached)")
    list_p.add_argument("--json", action="store_true")
    sub.add_parser("setup", help="check (and adapt) the installed libraries")
    mx = sub.add_parser("matrix", help="which model x backend x precision runs here (each in its own process)")
    mx.add_argument("--models", default=None, help="comma list (default: the whole zoo)")
    mx.add_argument("--backends", default=None, help="comma list (default: all)")
    mx.add_argument("--precisions", default=None, help="comma list (default: all)")
    mx.add_argument("--output", default="results/matrix", help="folder of the cells' records (resumes)")
    mx.add_argument("-t", "--threads", default=None)
    mx.add_argument("--point-timeout", type=_positive("--point-timeout", float, "seconds > 0"), default=900.0,
                    help="seconds per model x backend x precision before its process is killed")
    mx.add_argument("--render-only", action="store_true", help="only render the records already in --output")
    mx.add_argument("--readme", default=None, help="also replace the support matrix section of this README")
    return parser


def _guard(fn) -> int:
    """Run a command; turn known errors into one line and an exit code."""
    try:
        mode = configure()
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        return fn()
    except UsageError as exc:
        if mode >= 3:
            traceback.print_exc()
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except AioError as exc:
        if mode >= 3:
            traceback.print_exc()
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; records already written are kept", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001  (a bug: still one line unless the user asks for details)
        if mode >= 3:
            traceback.print_exc()
        print(f"{PROG}: internal error: {type(exc).__name__}: {exc} (AIO_DEBUG_MODE=3 shows the traceback)",
              file=sys.stderr)
        return 1


def main(argv=None) -> int:
    def go():
        args = build_parser().parse_args(argv)
        if args.command == "run":
            return do_run(args.model, args)
        if args.command == "list":
            return do_list(args)
        if args.command == "matrix":
            return do_matrix(args)
        return do_setup(args)
    return _guard(go)


def run_model(model: str, argv=None) -> int:
    """The whole body of a model folder's run.py: parse the run flags for this model and measure."""
    def go():
        parser = _Parser(prog=f"run.py ({model})", description=f"Benchmark {model} on CPU.")
        add_run_arguments(parser)
        return do_run(model, parser.parse_args(argv))
    return _guard(go)


if __name__ == "__main__":
    sys.exit(main())
