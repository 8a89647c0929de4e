"""host/bench/xtensa_cost.py: the board's machine code of the viper kernels, read from mpy-cross's .mpy.

Each figure the tool reports is checked against something it did not compute itself: the machine
code it takes out of the .mpy is in the file byte for byte, the loop it counts is the objdump text
between the loop's label and its branch back, its multiplies are the products the source writes
in that loop, and a kernel with one more product has one more multiply in its loop.
"""
import ast
import os
import re
import shutil
import subprocess
import sys

import pytest

import helpers

sys.path.insert(0, os.path.join(helpers.ROOT, "host", "bench"))
import xtensa_cost  # noqa: E402

pytestmark = pytest.mark.skipif(
    not shutil.which(xtensa_cost.XT_OBJDUMP),
    reason="%s not installed (Debian: apt-get install binutils-xtensa-lx106; `make xtensa-tools`)" % xtensa_cost.XT_OBJDUMP)


def _objdump_lines(code, start):
    """objdump's own text for the machine code: {address: line}, in order."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "xtensa-cost-test-%d.bin" % os.getpid())
    with open(path, "wb") as f:
        f.write(code)
    try:
        out = subprocess.run([xtensa_cost.XT_OBJDUMP, "-b", "binary", "-m", "xtensa", "-D", "-z",
                              "--start-address=%d" % start, path], capture_output=True, text=True, check=True).stdout
    finally:
        os.remove(path)
    return [line for line in out.splitlines() if re.match(r"^\s*[0-9a-f]+:\t", line)]


def _gemm():
    code = xtensa_cost.viper_code(xtensa_cost.GEMM)["_gemm"]
    insns = xtensa_cost.disassemble(code)
    return code, insns, xtensa_cost.loops(insns)


def test_the_machine_code_is_the_functions_bytes_in_the_mpy():
    data = xtensa_cost.compile_mpy(xtensa_cost.GEMM, "xtensawin")
    codes = xtensa_cost.viper_code(xtensa_cost.GEMM)
    assert set(codes) == set(xtensa_cost.viper_names(open(xtensa_cost.GEMM).read()))
    for name, code in codes.items():
        assert len(code) > 64 and data.count(code) == 1, name
    # the function starts where the jump over its constants lands, with the windowed ABI's entry
    insns = xtensa_cost.disassemble(codes["_gemm"])
    assert insns[0].mnem == "entry" and insns[0].addr == xtensa_cost.code_start(codes["_gemm"], "xtensawin") > 0
    assert insns[-1].mnem == "retw.n"


def test_the_inner_loop_is_the_objdump_text_between_its_label_and_its_branch():
    code, insns, lps = _gemm()
    loop = xtensa_cost.gemm_inner_loop(lps)
    lines = _objdump_lines(code, xtensa_cost.code_start(code, "xtensawin"))
    addrs = [int(line.split(":")[0], 16) for line in lines]
    first, last = addrs.index(loop.start), addrs.index(loop.end)
    text = lines[first:last + 1]
    assert len(loop) == len(text)
    assert re.search(r"\t(b\S*|j)\s.*0x%x\s*$" % loop.start, text[-1]), text[-1]     # the branch back
    assert loop.muls == sum(1 for line in text if "\tmull\t" in line)
    assert loop.inner == [] and loop.muls > 0


def _products_in_innermost_loops(src):
    """The number of `*` of each innermost `for` loop of a source text (its nested ifs included)."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.For) and not any(isinstance(n, (ast.For, ast.While)) for b in node.body
                                                 for n in ast.walk(b)):
            out.append(sum(1 for n in ast.walk(node) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)))
    return out


def test_the_inner_loop_multiplies_what_the_source_multiplies():
    with open(xtensa_cost.GEMM) as f:
        src = f.read()
    _, _, lps = _gemm()
    loop = xtensa_cost.gemm_inner_loop(lps)
    assert loop.muls == max(_products_in_innermost_loops(src))
    assert xtensa_cost.gemm_report()[1]["instr_per_mac"] == len(loop) / loop.muls


KERNEL = """
import micropython

@micropython.viper
def dot(a: ptr32, b: ptr32, n: int) -> int:
    acc = 0
    for i in range(n):
        acc += %s
    return acc
"""


@pytest.mark.parametrize("extra", [1, 2])
def test_a_kernel_with_more_multiplies_counts_them(tmp_path, extra):
    counts = []
    for k in (1, 1 + extra):
        path = tmp_path / ("dot%d.py" % k)
        path.write_text(KERNEL % " + ".join("a[i] * b[%d]" % j for j in range(k)))
        code = xtensa_cost.viper_code(str(path))["dot"]
        loop = xtensa_cost.gemm_inner_loop(xtensa_cost.loops(xtensa_cost.disassemble(code)))
        counts.append((loop.muls, len(loop)))
    assert counts[1][0] == counts[0][0] + extra
    assert counts[1][1] > counts[0][1]


def test_a_source_whose_viper_functions_do_not_match_the_mpy_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "k.py"
    path.write_text(KERNEL % "a[i] * b[i]")
    monkeypatch.setattr(xtensa_cost, "viper_names", lambda src: ["dot", "ghost"])
    with pytest.raises(xtensa_cost.MpyError, match=r"2 viper functions in the source \(dot, ghost\), 1 viper raw codes"):
        xtensa_cost.viper_code(str(path))


def test_a_truncated_mpy_is_refused():
    data = xtensa_cost.compile_mpy(xtensa_cost.GEMM, "xtensawin")
    with pytest.raises(xtensa_cost.MpyError, match="truncated|parsed"):
        xtensa_cost.read_mpy(data[:len(data) // 2])
    with pytest.raises(xtensa_cost.MpyError, match="version 6"):
        xtensa_cost.read_mpy(b"X" + data[1:])
