"""Read a compiled (SPMD-partitioned, per-device) HLO module's text: how often each computation
runs, the matmul FLOPs with loop trip counts, and the bytes each kind of collective moves.

XLA's `cost_analysis()` counts a while loop's body once (a `lax.scan` over layers is one
iteration's worth), so with `scan_layers=True` its FLOPs are ~layers times too low. Here every
computation gets a multiplicity - 1 for the entry, x trip count for a while body (read from the
loop condition `i < N` or `known_trip_count`), inherited by the fusions / calls it makes - and the
matmuls (`dot`, `convolution`) and collectives are counted that many times.

    stats = analyze(compiled.as_text())
    stats.matmul_flops, stats.matmul_flops_once, stats.collective_bytes  # per device
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections import defaultdict

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
               "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 0.5, "u4": 0.5,
               "token": 0}
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

_COMP_HEAD = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+(?:fn)?)?)\[([\d,]*)\]")
_OPCODE = re.compile(r"\s([a-z][\w\-]*)\(")


@dataclasses.dataclass
class Instruction:
    name: str
    shape: str  # the text before the opcode: "bf16[4,32]{...}" or a tuple "(f32[..], ...)"
    opcode: str
    operands: list[str]
    attrs: str
    line: str


@dataclasses.dataclass
class Computation:
    name: str
    entry: bool
    instructions: list[Instruction]

    def by_name(self) -> dict[str, Instruction]:
        return {i.name: i for i in self.instructions}


@dataclasses.dataclass
class HloStats:
    matmul_flops: float  # per device, loops counted trip-count times
    matmul_flops_once: float  # the same with every computation counted once (as cost_analysis does)
    collective_bytes: dict  # kind -> bytes sent per device (loops counted trip-count times)
    collective_counts: dict  # kind -> number of executions
    trip_counts: dict  # while body computation -> trip count
    largest_all_gather: float  # bytes of the largest single all-gather result (whole-parameter gathers show here)


def array_shapes(text: str) -> list[tuple[str, tuple[int, ...]]]:
    """Every array shape in a shape string ('(bf16[2,3]{1,0}, f32[])' -> [('bf16', (2, 3)), ('f32', ())])."""
    out = []
    for dtype, dims in _ARRAY.findall(text):
        if dtype in DTYPE_BYTES:
            out.append((dtype, tuple(int(d) for d in dims.split(",") if d)))
    return out


def shape_bytes(text: str) -> float:
    return float(sum(DTYPE_BYTES[d] * math.prod(s) for d, s in array_shapes(text)))


def _split_top(s: str) -> list[str]:
    """Split on commas not nested in (), [], {}."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if cur and "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _parse_instruction(line: str) -> Instruction | None:
    m = _INSTR.match(line)
    if not m:
        return None
    name, rest = m.group(2), m.group(3)
    # The shape ends where the opcode starts: the first " opcode(" at nesting depth 0.
    depth, cut = 0, None
    for i, ch in enumerate(rest):
        if ch in "([{":
            if ch == "(" and depth == 0 and i > 0 and rest[i - 1] not in " ,":
                j = i - 1
                while j >= 0 and (rest[j].isalnum() or rest[j] in "-_"):
                    j -= 1
                if j >= 0 and rest[j] == " ":
                    cut = (j, i)
                    break
            depth += 1
        elif ch in ")]}":
            depth -= 1
    if cut is None:
        return None
    shape, opcode = rest[: cut[0]].strip(), rest[cut[0] + 1: cut[1]]
    depth, end = 0, None
    for i in range(cut[1], len(rest)):
        if rest[i] == "(":
            depth += 1
        elif rest[i] == ")":
            depth -= 1
            if depth == 0:
                end = i
                break
    inner = rest[cut[1] + 1: end] if end else ""
    operands = [p.split()[-1].lstrip("%") for p in _split_top(inner) if p and p.split()]
    attrs = rest[end + 1:] if end else ""
    return Instruction(name, shape, opcode, operands, attrs, line)


def parse_module(text: str) -> dict[str, Computation]:
    comps: dict[str, Computation] = {}
    current = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if current is None:
            m = _COMP_HEAD.match(line)
            if m:
                current = Computation(m.group(2), bool(m.group(1)), [])
            continue
        if line.strip() == "}":
            comps[current.name] = current
            current = None
            continue
        inst = _parse_instruction(line)
        if inst is not None:
            current.instructions.append(inst)
    return comps


def _callees(inst: Instruction) -> list[tuple[str, str]]:
    """(role, computation) pairs an instruction calls."""
    out = []
    for role in ("calls", "body", "condition", "to_apply"):
        for m in re.finditer(rf"\b{role}=%?([\w.\-]+)", inst.attrs):
            out.append((role, m.group(1)))
    for m in re.finditer(r"branch_computations=\{([^}]*)\}", inst.attrs):
        out += [("branch", c.strip().lstrip("%")) for c in m.group(1).split(",") if c.strip()]
    return out


def _constant(inst: Instruction | None, names: dict[str, Instruction]) -> int | None:
    """The integer value of a scalar constant (through copies / converts / bitcasts), else None."""
    for _ in range(4):
        if inst is None:
            return None
        if inst.opcode == "constant":
            value = re.search(r"constant\((-?\d+)\)", inst.line)
            return int(value.group(1)) if value else None
        if inst.opcode in ("copy", "convert", "bitcast") and inst.operands:
            inst = names.get(inst.operands[0])
            continue
        return None
    return None


def _tuple_index(inst: Instruction | None) -> int | None:
    if inst is None or inst.opcode != "get-tuple-element":
        return None
    m = re.search(r"index=(\d+)", inst.attrs)
    return int(m.group(1)) if m else None


def trip_count(inst: Instruction, comps: dict[str, Computation], caller: Computation | None = None) -> int:
    """Iterations of a while loop: backend_config known_trip_count, else from the condition
    `i < N` (or <=), the body's step `i + k` and the start value the loop is given:
    ceil((N - start) / k). The TPU compiler's windowed einsums (all-gather fused into a matmul
    loop, bidirectional) step their counter by 2: counting `i < 8` as 8 trips would double them."""
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"', inst.attrs)
    if m:
        return int(m.group(1))
    cond = next((c for r, c in _callees(inst) if r == "condition"), None)
    comp = comps.get(cond)
    if comp is None:
        return 1
    names = comp.by_name()
    root = next((i for i in comp.instructions if i.line.lstrip().startswith("ROOT")), None)
    if root is None or root.opcode != "compare" or len(root.operands) != 2:
        return 1
    direction = re.search(r"direction=(\w+)", root.attrs)
    direction = direction.group(1) if direction else "LT"
    a, b = (names.get(o) for o in root.operands)
    limit, counter = _constant(b, names), a
    if limit is None:  # N > i
        limit, counter = _constant(a, names), b
        direction = {"GT": "LT", "GE": "LE"}.get(direction, direction)
    if limit is None:
        return 1
    index = _tuple_index(counter)
    step, start = 1, 0
    if index is not None:
        body = comps.get(next((c for r, c in _callees(inst) if r == "body"), ""))
        if body is not None:
            bnames = body.by_name()
            broot = next((i for i in body.instructions if i.line.lstrip().startswith("ROOT")), None)
            if broot is not None and broot.opcode == "tuple" and index < len(broot.operands):
                update = bnames.get(broot.operands[index])
                if update is not None and update.opcode == "add" and len(update.operands) == 2:
                    x, y = (bnames.get(o) for o in update.operands)
                    for var, const in ((x, y), (y, x)):
                        k = _constant(const, bnames)
                        if k and k > 0 and _tuple_index(var) == index:
                            step = k
                            break
        if caller is not None and inst.operands:
            cnames = caller.by_name()
            init = cnames.get(inst.operands[0])
            if init is not None and init.opcode == "tuple" and index < len(init.operands):
                start = _constant(cnames.get(init.operands[index]), cnames) or 0
    n = limit + 1 if direction == "LE" else limit
    return max(1, -(-(n - start) // step))


def multiplicities(comps: dict[str, Computation]) -> tuple[dict[str, float], dict[str, int]]:
    """How many times each computation runs per call of the entry (scalar to_apply reducers: 0 -
    their cost belongs to the reduce / all-reduce that applies them)."""
    edges: dict[str, list[tuple[str, float]]] = defaultdict(list)
    trips: dict[str, int] = {}
    for comp in comps.values():
        for inst in comp.instructions:
            for role, callee in _callees(inst):
                if role == "to_apply":
                    continue
                factor = 1.0
                if inst.opcode == "while":
                    n = trip_count(inst, comps, comp)
                    if role == "body":
                        trips[callee] = n
                        factor = n
                    else:
                        factor = n + 1
                edges[comp.name].append((callee, factor))
    mult: dict[str, float] = defaultdict(float)
    entry = next((c.name for c in comps.values() if c.entry), None)
    if entry is None:
        return {}, trips
    # Computations form a DAG: accumulate in topological order from the entry.
    order, seen = [], set()

    def visit(name):
        if name in seen:
            return
        seen.add(name)
        for callee, _ in edges.get(name, ()):
            visit(callee)
        order.append(name)

    visit(entry)
    mult[entry] = 1.0
    for name in reversed(order):
        for callee, factor in edges.get(name, ()):
            mult[callee] += mult[name] * factor
    return dict(mult), trips


def matmul_flops(inst: Instruction, names: dict[str, Instruction]) -> float:
    """2 x output elements x contraction size of a dot / convolution (0 for anything else)."""
    out = array_shapes(inst.shape)
    if not out or inst.opcode not in ("dot", "convolution"):
        return 0.0
    out_elems = math.prod(out[0][1])
    if inst.opcode == "dot":
        lhs = names.get(inst.operands[0]) if inst.operands else None
        dims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", inst.attrs)
        if lhs is None or not dims:
            return 0.0
        shape = array_shapes(lhs.shape)[0][1]
        k = math.prod(shape[int(d)] for d in dims.group(1).split(",") if d)
        return 2.0 * out_elems * k
    lhs = names.get(inst.operands[0]) if inst.operands else None
    kernel = names.get(inst.operands[1]) if len(inst.operands) > 1 else None
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", inst.attrs)
    if lhs is None or kernel is None or not labels:
        return 0.0
    ilab, klab, olab = labels.groups()
    lshape, kshape, oshape = array_shapes(lhs.shape)[0][1], array_shapes(kernel.shape)[0][1], out[0][1]
    k = float(kshape[klab.index("i")])
    # Spatial dims: count the window taps that land on real input (not padding, not the holes of an
    # lhs dilation) - dots with batch dimensions are written as such convolutions on TPU.
    window = re.search(r"window=\{([^}]*)\}", inst.attrs)
    fields = dict(f.split("=", 1) for f in window.group(1).split()) if window else {}
    spatial = sorted(c for c in klab if c.isdigit())

    def per_dim(key, default):
        value = fields.get(key)
        return [default] * len(spatial) if value is None else value.split("x")

    sizes = [int(x) for x in per_dim("size", 1)]
    strides = [int(x) for x in per_dim("stride", 1)]
    pads = [int(x.split("_")[0]) for x in per_dim("pad", "0_0")]
    lhs_dil = [int(x) for x in per_dim("lhs_dilate", 1)]
    rhs_dil = [int(x) for x in per_dim("rhs_dilate", 1)]
    for j, d in enumerate(spatial):
        n, n_out = lshape[ilab.index(d)], oshape[olab.index(d)]
        span = (n - 1) * lhs_dil[j]
        valid = 0
        for pos in range(n_out):
            for t in range(sizes[j]):
                x = pos * strides[j] + t * rhs_dil[j] - pads[j]
                valid += 0 <= x <= span and x % lhs_dil[j] == 0
        k *= valid / max(n_out, 1)
    return 2.0 * out_elems * k


def collective_kind(opcode: str) -> str | None:
    for kind in COLLECTIVES:
        if opcode == kind or opcode == kind + "-start":
            return kind
    return None


def group_size(attrs: str, default: int) -> int:
    """Devices in each replica group: `{{0,1},{2,3}}`, iota `[2,4]<=[8]` or `mesh['a'=4,'b'=2] {'a'}`."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if m:
        sizes = dict((k.strip().strip("'"), int(v)) for k, v in (p.split("=") for p in m.group(1).split(",") if "=" in p))
        axes = [a.strip().strip("'") for a in m.group(2).split(",") if a.strip()]
        return math.prod(sizes.get(a, 1) for a in axes) if axes else default
    m = re.search(r"replica_groups=\[([\d,]+)\]<=", attrs)
    if m:
        return int(m.group(1).split(",")[-1])
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", attrs)
    if m:
        return len([x for x in m.group(1).split(",") if x])
    return default


def collective_bytes(inst: Instruction, names: dict[str, Instruction], devices: int) -> float:
    """Bytes one device sends for a collective (ring algorithms, group of n):
    all-gather (n-1)/n x result, reduce-scatter (n-1)/n x input, all-reduce 2 (n-1)/n x input,
    all-to-all (n-1)/n x input, collective-permute: the whole input."""
    kind = collective_kind(inst.opcode)
    if kind is None:
        return 0.0
    n = group_size(inst.attrs, devices)
    operand_bytes = sum(shape_bytes(names[o].shape) for o in inst.operands if o in names)
    if kind == "collective-permute":
        return operand_bytes
    if n <= 1:
        return 0.0
    share = (n - 1) / n
    if kind == "all-gather":
        shapes = array_shapes(inst.shape)
        if inst.opcode.endswith("-start"):  # (operands..., results...): the second half
            shapes = shapes[len(shapes) // 2:]
        return share * sum(DTYPE_BYTES[d] * math.prod(s) for d, s in shapes)
    if kind == "all-reduce":
        return 2 * share * operand_bytes
    return share * operand_bytes


def analyze(text: str, devices: int = 1) -> HloStats:
    comps = parse_module(text)
    mult, trips = multiplicities(comps)
    flops = flops_once = 0.0
    coll = {k: 0.0 for k in COLLECTIVES}
    counts = {k: 0 for k in COLLECTIVES}
    largest = 0.0
    channels: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for comp in comps.values():
        m = mult.get(comp.name, 0.0)
        names = None
        for inst in comp.instructions:
            if inst.opcode in ("dot", "convolution"):
                names = names or comp.by_name()
                f = matmul_flops(inst, names)
                flops += m * f
                flops_once += f if m else 0.0
            kind = collective_kind(inst.opcode)
            if kind is not None and m:
                names = names or comp.by_name()
                channel = re.search(r"channel_id=(\d+)", inst.attrs)
                key = (kind, channel.group(1)) if channel else (kind, comp.name, inst.name)
                channels[key].append((m, collective_bytes(inst, names, devices)))
                if kind == "all-gather":
                    shapes = array_shapes(inst.shape)
                    largest = max([largest] + [DTYPE_BYTES[d] * math.prod(s) for d, s in shapes])
    # One collective (channel_id) can appear in several computations: the TPU compiler's async
    # collective fusions carry the same all-gather into each step of a windowed-einsum loop to
    # overlap it piecewise. It moves its bytes once per run of the outermost place it sits in:
    # counted once, at the lowest multiplicity among its copies (11B, v5e:4x4, fsdp 16: 8.4 GiB of
    # all-gathers per chip = 3 sides x 24 layers x the 128 MiB bf16 MLP kernel, not 287 GiB).
    for (kind, *_), copies in channels.items():
        m, nbytes = min(copies)
        coll[kind] += m * nbytes
        counts[kind] += int(m)
    return HloStats(flops, flops_once, coll, counts, trips, largest)


def matmul_breakdown(text: str) -> list[dict]:
    """Every dot / convolution of a compiled module with its FLOPs per execution, how often it runs
    (loop trip counts) and the jax op it came from (metadata op_name): where a step's FLOPs go."""
    comps = parse_module(text)
    mult, _ = multiplicities(comps)
    out = []
    for comp in comps.values():
        m = mult.get(comp.name, 0.0)
        names = None
        for inst in comp.instructions:
            if inst.opcode not in ("dot", "convolution") or not m:
                continue
            names = names or comp.by_name()
            f = matmul_flops(inst, names)
            op = re.search(r'op_name="([^"]*)"', inst.attrs)
            out.append({"computation": comp.name, "name": inst.name, "opcode": inst.opcode, "shape": inst.shape.split("{")[0],
                        "operands": [names[o].shape.split("{")[0] for o in inst.operands if o in names],
                        "flops": f, "times": m, "total": f * m, "op_name": op.group(1) if op else ""})
    return sorted(out, key=lambda r: -r["total"])


# Opcodes that only move or re-type data: a fusion of nothing else, with a transpose or copy in
# it, is a layout change written to memory (the cost that layouts matching the dots avoid).
_MOVES_ONLY = {"parameter", "transpose", "copy", "bitcast", "convert", "reshape", "broadcast", "constant", "slice",
               "tuple", "get-tuple-element"}


def layout_moves(text: str) -> dict:
    """The layout changes of a compiled module that are written to memory: top-level transposes and
    copies, and fusions made of data moves only (with a transpose or copy) - {'count', 'bytes'},
    loops counted trip-count times. A transpose XLA folds into a dot or a compute fusion is free
    and not counted."""
    comps = parse_module(text)
    mult, _ = multiplicities(comps)
    fused = {callee for comp in comps.values() for inst in comp.instructions if inst.opcode == "fusion"
             for role, callee in _callees(inst) if role == "calls"}
    count = moved = 0.0
    for comp in comps.values():
        if comp.name in fused or not mult.get(comp.name):
            continue
        for inst in comp.instructions:
            if inst.opcode == "fusion":
                body = {i.opcode for role, c in _callees(inst) if role == "calls" for i in comps[c].instructions}
                if not (body <= _MOVES_ONLY and body & {"transpose", "copy"}):
                    continue
            elif inst.opcode not in ("transpose", "copy"):
                continue
            count += mult[comp.name]
            moved += mult[comp.name] * shape_bytes(inst.shape)
    return {"count": int(count), "bytes": int(moved)}


def op_group(op_name: str) -> str:
    """'jit(f)/transpose(jvp(M))/backbone.encode/encoder/layers_3/mlp/wi/dot_general' ->
    'backward: encoder/layers_N/mlp/wi' (forward / backward / rematerialised forward)."""
    if not op_name:
        return ""
    kind = "backward" if "transpose(" in op_name else "forward"
    if "rematted_computation" in op_name or "checkpoint" in op_name and kind == "forward" and "transpose(" in op_name:
        kind = "remat forward"
    parts = [p for p in op_name.split("/") if p and not p.startswith(("jit(", "jvp(", "transpose(", "vmap("))]
    parts = [re.sub(r"_\d+$", "_N", p) for p in parts if p not in ("dot_general", "conv_general_dilated")]
    return f"{kind}: {'/'.join(parts[-4:])}"


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Where a compiled HLO module's matmul FLOPs go (per device).")
    parser.add_argument("hlo_file")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    text = open(args.hlo_file).read()
    rows = matmul_breakdown(text)
    total = sum(r["total"] for r in rows)
    print(f"matmul FLOPs per device: {total / 1e12:.3f} T in {len(rows)} dot / convolution instructions")
    groups: dict[str, float] = defaultdict(float)
    for r in rows:
        groups[op_group(r["op_name"]) or r["opcode"]] += r["total"]
    print("by jax op (op_name: forward / backward (transpose), layer numbers as N, last 3 module levels):")
    for k, v in sorted(groups.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {v / total * 100:5.1f}%  {v / 1e12:8.3f} T  {k}")
    print(f"top {args.top} instructions:")
    for r in rows[:args.top]:
        print(f"  {r['total'] / total * 100:5.1f}%  x{r['times']:<5.0f} {r['flops'] / 1e9:9.2f} GFLOP  {r['shape']} <- "
              f"{', '.join(r['operands'])}  {r['op_name'][-110:]}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main())
