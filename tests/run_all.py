"""Run every test file in its own pytest process, as many at a time as this machine has cores.

    python3 tests/run_all.py [--jobs N] [pytest options, e.g. -m slow or -x]

Each file gets a process of its own (compiled code and compiler state never cross files). Most tests run a script
in a subprocess on one thread, so a file keeps about one core busy: running files side by side is what brings the
suite to its time on a 2-core machine. The files that run every pair's scripts start first, then the others larger
first, so the run does not end waiting on a long one.
A file's output is printed whole when it ends; then a line per file (status, seconds) and the exit code: 0 when
every file passed, 1 otherwise.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
EVERY_PAIR = ("test_regression.py", "test_gpu_path.py")  # short files, long runs: each runs every pair's scripts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="files at a time (cores)")
    args, pytest_args = parser.parse_known_args(argv)
    if args.jobs < 1:
        parser.exit(2, f"run_all.py: --jobs must be at least 1, got {args.jobs}\n")
    files = sorted(TESTS.glob("test_*.py"), key=lambda f: (f.name not in EVERY_PAIR, -f.stat().st_size, f.name))
    waiting, running, done = list(files), {}, []
    start = time.time()
    try:
        while waiting or running:
            while waiting and len(running) < args.jobs:
                f = waiting.pop(0)
                log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed when the file ends)
                cmd = [sys.executable, "-m", "pytest", str(f.relative_to(TESTS.parent)), *pytest_args]
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=TESTS.parent)
                running[proc] = (f, log, time.time())
            time.sleep(0.2)
            for proc in [p for p in running if p.poll() is not None]:
                f, log, began = running.pop(proc)
                log.seek(0)
                print(f"\n===== {f.name} =====\n{log.read()}", flush=True)
                log.close()
                # pytest's exit code 5: no test selected (e.g. -m slow in a file without slow tests)
                done.append((f.name, "passed" if proc.returncode in (0, 5) else "FAILED", time.time() - began))
    except KeyboardInterrupt:
        for proc in running:
            proc.terminate()
        raise
    print(f"\n{len(done)} test files, {args.jobs} at a time, in {time.time() - start:.0f} s:")
    for name, status, seconds in sorted(done, key=lambda row: -row[2]):
        print(f"  {status:6s} {seconds:6.0f} s  {name}")
    return int(any(status == "FAILED" for _, status, _ in done))


if __name__ == "__main__":
    sys.exit(main())
