"""Command line: `aio-examples run|list|setup`, and the shared entry of every model's run.py.

Only this module turns errors into messages and exit codes (2 for bad input).
"""

import sys
import traceback

from ..core.errors import AioError, UsageError
from ..core.interrupts import Terminated, stop_on_signals
from ..core.log import configure
from ..drivers.worker import add_run_arguments
from .commands import COMMANDS, do_run
from .parser import PROG, Parser, build_parser


def _guard(fn) -> int:
    """Run a command; turn known errors into one line and an exit code."""
    try:
        mode = configure()
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        with stop_on_signals():         # SIGTERM stops a command as Ctrl-C does
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
    except Terminated:
        print(f"{PROG}: terminated (SIGTERM); records already written are kept", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; records already written are kept", file=sys.stderr)
        return 130
    except BrokenPipeError:          # the reader went away (`| head`): not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001  (a bug: still one line unless the user asks for details)
        if mode >= 3:
            traceback.print_exc()
        print(f"{PROG}: internal error: {type(exc).__name__}: {exc} (AIO_DEBUG_MODE=3 shows the traceback)",
              file=sys.stderr)
        return 1


def main(argv=None) -> int:
    def go():
        args = build_parser().parse_args(argv)
        if args.command in ("run", "profile"):
            args.profile = args.profile or args.command == "profile"
            return do_run(args.model, args)
        return COMMANDS[args.command](args)
    return _guard(go)


def run_model(model: str, argv=None) -> int:
    """The whole body of a model folder's run.py: parse the run flags for this model and measure."""
    def go():
        parser = Parser(prog=f"run.py ({model})", description=f"Benchmark {model} on CPU.")
        add_run_arguments(parser)
        return do_run(model, parser.parse_args(argv))
    return _guard(go)


if __name__ == "__main__":
    sys.exit(main())
