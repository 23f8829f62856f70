"""A process that imports what the scripts import, once, then forks a child for every script run a test asks for.

    python3 tests/preloaded.py        # started by conftest.run_script, one per test process; reads requests on stdin

Starting a script costs seconds of CPU before its first line of RL: torch, tensordict (which imports torch's
compiler), gymnasium, envpool, tyro. The test suite runs scripts many hundred times on CI's 2 cores, so a child
forked from a process that holds those modules starts at the script's own code. The child is the run a user starts
with `python leanrl/<script>.py ARGS`: the script runs as __main__ with its argv, in its working directory, with the
environment asked for, its stdout and stderr to files, and its exit code (2 for bad input, 1 with a traceback for an
uncaught exception) as the process's. What an environment variable changes when torch loads (a float path, the
thread count, TORCH_LOGS) cannot change in a child of a process that loaded it: conftest.run_script starts those runs
as processes of their own.

Protocol, a JSON object a line: request {"script", "argv", "cwd", "env", "stdout", "stderr"} on stdin; the reply is
the child's {"pid"}, then, when it has ended, its {"returncode"} (minus the signal's number when a signal ended it).
"""

import atexit
import contextlib
import json
import os
import runpy
import signal
import sys
import traceback

import envpool  # noqa: F401
import gymnasium  # noqa: F401
import numpy  # noqa: F401
import tensordict.nn  # noqa: F401
import torch  # noqa: F401
import tyro  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import leanrl.bookkeeping  # noqa: E402, F401


def run_child(request):
    """In the forked child: the script as `python script argv` runs it; never returns."""
    code = 1
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):  # at their default actions, as in a job a shell starts
            signal.signal(signum, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.argv = [request["script"], *request["argv"]]
        sys.path[0] = os.path.dirname(request["script"])
        try:
            runpy.run_path(request["script"], run_name="__main__")
            code = 0
        except SystemExit as exit:  # as the interpreter reads it: None 0, an int itself, anything else printed and 1
            if exit.code is None or isinstance(exit.code, int):
                code = exit.code or 0
            else:
                print(exit.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def main():
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            run_child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
