"""Where a step's time goes: a jax.profiler trace summarised offline into op classes.

    python -m sentemb_jax.benchmarks.profile_table DIR [--steps N]

DIR holds a trace written by `jax.profiler.trace(DIR, create_perfetto_trace=True)` (step_time
`--profile DIR` writes one around N steps, and the step's compiled HLO beside it as
DIR/step.hlo.txt). Every XLA operation the device ran (on a GPU or TPU the device's streams; on
the CPU the XLA client's threads) goes to one class, first match: rng (the model's `dropout` name
scope, threefry, RngBitGenerator), optimizer (the step's `optimizer` scope), attention (the
`attention_core` scope: q.k, softmax and the weighted sum, or cuDNN's fused kernel; the
projections are matmuls), matmul, layout copies and
transposes, elementwise (every other fusion). With the HLO an operation is classed by its
instruction, the fused computation it calls and their op_name metadata (jax's name scopes);
without it, by the kernel's name alone. Idle is the wall time of the traced steps during which
no operation ran. Printed per class: ms per step and % of the step.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import sys
from typing import Iterable, Sequence

from sentemb_jax.errors import DataError, SentembError, UsageError

# (class, pattern over an operation's text: kernel name, HLO instruction and its fused computation), first match
CLASSES: list[tuple[str, re.Pattern]] = [
    ("rng", re.compile(r"/dropout/|threefry|rng-bit-generator|rng_bit_generator|random_bits|philox")),
    ("optimizer", re.compile(r"/optimizer/|optax|adafactor")),
    ("attention", re.compile(r"/attention_core/|fmha|flash_attn|cudnn.*(attn|attention|sdpa)")),
    ("matmul", re.compile(r"gemm|cublas|cutlass|xmma|matmul|\bdot\(|\bdot[._]|dot_general|convolution|ynn_fusion")),
    ("layout", re.compile(r"^\s*(ROOT )?%?[\w.-]+ = \S+ (copy|transpose)\(|\b(transpose|copy)[._]\d", re.M)),
]
ELEMENTWISE = "elementwise"
ORDER = ["matmul", "attention", "rng", "layout", "optimizer", ELEMENTWISE, "idle"]
HLO_FILE = "step.hlo.txt"
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.-]+) \(.*\{\s*$")  # a header: unindented, ends with "{"
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.-]+) = ")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.-]+)")


def hlo_texts(hlo: str) -> dict[str, str]:
    """{instruction name: its line plus the bodies of the computations it calls, recursively}."""
    bodies: dict[str, list[str]] = {}
    current = None
    for line in hlo.splitlines():
        if current is None:
            m = _COMPUTATION.match(line)
            if m:
                current = m.group(1)
                bodies[current] = []
        elif line.startswith("}"):
            current = None
        else:
            bodies[current].append(line)

    def expand(lines: list[str], seen: set[str]) -> str:
        out = []
        for line in lines:
            out.append(line)
            for callee in _CALLS.findall(line):
                if callee in bodies and callee not in seen:
                    seen.add(callee)
                    out.append(expand(bodies[callee], seen))
        return "\n".join(out)

    texts = {}
    for lines in bodies.values():
        for line in lines:
            m = _INSTRUCTION.match(line)
            if m:
                texts[m.group(1)] = expand([line], set())
    return texts


def trace_file(directory: str) -> str:
    files = sorted(glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True))
    if not files:
        raise DataError(f"{directory}: no *.trace.json.gz (write one with jax.profiler.trace(DIR, create_perfetto_trace=True))")
    return files[-1]


def _events(path: str) -> list[dict]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a gzipped JSON trace ({type(e).__name__}: {e})") from None
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise DataError(f"{path}: no traceEvents list")
    return [e for e in events if isinstance(e, dict)]


def device_ops(events: Iterable[dict]) -> list[dict]:
    """The XLA operations of a trace: complete events on a device's tracks (a GPU's or TPU's), else
    (a CPU trace) on the XLA client's threads, without the runtime's own bookkeeping events."""
    events = list(events)
    processes = {e.get("pid"): str(e.get("args", {}).get("name", "")) for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name", "")) for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    complete = [e for e in events if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]
    device = [e for e in complete if re.search(r"/device:(GPU|TPU)", processes.get(e.get("pid"), ""))]
    if device:
        return device
    return [e for e in complete if threads.get((e.get("pid"), e.get("tid")), "").startswith("tf_XLA")
            and "::" not in e.get("name", "") and not e.get("name", "").startswith("end: ")]


def op_class(event: dict, hlo: dict[str, str] | None = None) -> str:
    args = event.get("args", {}) if isinstance(event.get("args"), dict) else {}
    names = [str(x) for x in (event.get("name", ""), args.get("hlo_op", ""), args.get("long_name", "")) if x]
    expanded = [hlo[n] for n in names if hlo and n in hlo]
    text = "\n".join(names + expanded).lower()
    own = "\n".join(names + [x.split("\n", 1)[0] for x in expanded])  # the instruction itself, not what it fuses
    return next((name for name, pattern in CLASSES if pattern.search(own if name == "layout" else text)), ELEMENTWISE)


def _busy(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def summarise(directory: str, steps: int = 1, hlo: str | None = None) -> dict:
    """{'rows': [{'class', 'ms_per_step', 'percent'}], 'wall_ms_per_step', 'ops'} of the trace in
    `directory`, over `steps` traced steps. Class times are summed over every stream or thread
    (operations on several streams at once count in each); idle is the wall time with none. `hlo`:
    the step's compiled HLO text (default: DIR/step.hlo.txt where it exists)."""
    if steps < 1:
        raise UsageError(f"steps={steps}: expected at least 1 traced step")
    ops = device_ops(_events(trace_file(directory)))
    if hlo is None and os.path.isfile(os.path.join(directory, HLO_FILE)):
        with open(os.path.join(directory, HLO_FILE), encoding="utf-8") as f:
            hlo = f.read()
    texts = hlo_texts(hlo) if hlo else None
    if not ops:
        raise DataError(f"{directory}: the trace holds no XLA operation (was the step run inside the trace?)")
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ops]
    wall = max(b for _, b in spans) - min(a for a, _ in spans)
    per_class = {name: 0.0 for name in ORDER}
    for e in ops:
        per_class[op_class(e, texts)] += float(e["dur"])
    per_class["idle"] = max(wall - _busy(spans), 0.0)
    total = sum(per_class.values()) or 1.0
    rows = [{"class": name, "ms_per_step": per_class[name] / 1e3 / steps, "percent": 100.0 * per_class[name] / total}
            for name in ORDER]
    return {"rows": rows, "wall_ms_per_step": wall / 1e3 / steps, "ops": len(ops), "steps": steps}


def table_lines(summary: dict) -> list[str]:
    lines = ["| op class | ms / step | % |", "|---|---:|---:|"]
    lines += [f"| {r['class']} | {r['ms_per_step']:.2f} | {r['percent']:.1f} |" for r in summary["rows"]]
    return lines + [f"({summary['ops']} operations over {summary['steps']} steps; wall {summary['wall_ms_per_step']:.2f} ms "
                    "per step)"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sentemb_jax.benchmarks.profile_table", description=__doc__.split("\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--steps", type=int, default=1, help="how many steps the trace holds")
    args = parser.parse_args(argv)
    print("\n".join(table_lines(summarise(args.directory, args.steps))))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SentembError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
