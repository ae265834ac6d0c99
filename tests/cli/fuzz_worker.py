"""Runs the CLI's `main` on each argv list read from stdin (JSON), in this one process; prints each outcome.

Each call gets the environment this process started with (a command may export thread variables) and its
stderr is captured; the outcomes go to stdout as a JSON list of {code, stderr}.
"""

import contextlib
import io
import json
import os
import sys

from aio_examples.cli import main

cases = json.load(sys.stdin)
start_env = dict(os.environ)
outcomes = []
for argv in cases:
    print(argv, file=sys.__stderr__, flush=True)        # the last one named, should a case bring the process down
    os.environ.clear()
    os.environ.update(start_env)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:          # never expected: the CLI returns its exit code
            code = f"SystemExit({exc.code})"
    outcomes.append({"code": code, "stderr": err.getvalue()})
print(json.dumps(outcomes))
