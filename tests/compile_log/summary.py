"""Sums a test run's compile log per test file, beside each file's test time:

    SENTEMB_TEST_COMPILE_LOG=/tmp/compile_log make test
    python tests/compile_log/summary.py /tmp/compile_log .pytest-times.xml [--top 20]

prints a markdown table, the slowest files first: the seconds of the file's tests (pytest's junit
XML), then the seconds JAX spent tracing, lowering to MLIR and compiling in the file's tests, in
the pytest worker and in every process they started, and the number of processes (the worker
included) that traced or compiled in them. Compile seconds are not wall time: two workers share the
cores, and a test waits while its child processes compile."""
import argparse
import collections
import glob
import os
import sys
import xml.etree.ElementTree as ET

PHASES = ("trace", "lower", "compile")


def file_of(test: str) -> str:
    return os.path.basename(test.split("::")[0]) if test != "-" else "(between tests)"


def read_log(folder: str) -> tuple[dict, dict]:
    """({file: {phase: seconds}}, {file: set of pids}) from FOLDER/<pid>.tsv."""
    seconds = collections.defaultdict(collections.Counter)
    pids = collections.defaultdict(set)
    paths = glob.glob(os.path.join(folder, "*.tsv"))
    if not paths:
        raise SystemExit(f"{folder}: no <pid>.tsv files (was SENTEMB_TEST_COMPILE_LOG set to it for the run?)")
    for path in paths:
        pid = os.path.basename(path)[:-4]
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for n, line in enumerate(lines, 1):
            parts = line.split("\t")
            try:
                spent = float(parts[2]) if len(parts) == 3 and parts[1] in PHASES else None
            except ValueError:
                spent = None
            if spent is None:
                if n == len(lines):
                    continue  # "" after the last newline, or the line of a process killed while writing it
                raise SystemExit(f"{path}:{n}: not TEST<tab>PHASE<tab>SECONDS: {line!r}")
            seconds[file_of(parts[0])][parts[1]] += spent
            pids[file_of(parts[0])].add(pid)
    return seconds, pids


def read_test_times(junit_xml: str) -> collections.Counter:
    times = collections.Counter()
    for case in ET.parse(junit_xml).iter("testcase"):
        times[case.get("classname", "").split(".")[-1] + ".py"] += float(case.get("time", 0))
    return times


def table(seconds: dict, pids: dict, times: collections.Counter, top: int) -> str:
    files = sorted(set(times) | set(seconds), key=lambda f: (-times[f], -sum(seconds[f].values())))
    rows = ["| file | test s | trace s | lower s | compile s | processes |", "|---|---:|---:|---:|---:|---:|"]
    for f in files[:top]:
        s = seconds.get(f, {})
        rows.append(f"| {f} | {times[f]:.0f} | {s.get('trace', 0):.0f} | {s.get('lower', 0):.0f} | "
                    f"{s.get('compile', 0):.0f} | {len(pids.get(f, ()))} |")
    total = collections.Counter()
    for s in seconds.values():
        total.update(s)
    rows.append(f"| all {len(files)} files | {sum(times.values()):.0f} | {total['trace']:.0f} | {total['lower']:.0f} | "
                 f"{total['compile']:.0f} | |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log_folder")
    parser.add_argument("junit_xml")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    seconds, pids = read_log(args.log_folder)
    print(table(seconds, pids, read_test_times(args.junit_xml), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
