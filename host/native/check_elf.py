# host/native/check_elf.py: what a MicroPython natmod may not contain, checked on the compiled object
# before mpy_ld links it (host/native/build.sh), and the .mpy header after.
#   python host/native/check_elf.py OBJ.o          no initialised data, no undefined symbol but the
#                                                  firmware's function table (so no libgcc helper
#                                                  such as __divsf3, no libm, no memset / memcpy)
#   python host/native/check_elf.py --mpy ARCH F   F's header: .mpy version 6, architecture ARCH
# Exit status 1 with one line per problem. Needs pyelftools (requirements.txt).
import sys

# .mpy header: b'M', version, (arch << 2) | sub-version, small-int bits (py/persistentcode.h)
MPY_VERSION = 6
MPY_SUB_VERSION = 3
ARCHS = {"x86": 1, "x64": 2, "armv6m": 4, "armv7m": 5, "armv7em": 6, "armv7emsp": 7, "armv7emdp": 8,
         "xtensa": 9, "xtensawin": 10, "rv32imc": 11, "rv64imc": 12}
# the only symbols a module may leave to the loader: the firmware's function table, the qstr and
# object tables mpy_ld fills in, and on x86 the
# GOT base that -fpic code names (mpy_ld resolves it)
ALLOWED_UNDEFINED = {"mp_fun_table", "mp_native_qstr_table", "mp_native_obj_table", "_GLOBAL_OFFSET_TABLE_"}


def object_problems(path):
    """The problems of the ELF object at path, as sentences (empty: none)."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection
    out = []
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for sec in elf.iter_sections():
            name = sec.name
            initialised = name.startswith((".data", ".sdata")) and not name.startswith(".data.rel.ro")
            if initialised and sec["sh_size"] > 0:
                out.append("%s: section %s holds %d bytes of initialised data (natmods have no .data: "
                           "set globals at run time)" % (path, name, sec["sh_size"]))
        for sec in elf.iter_sections():
            if not isinstance(sec, SymbolTableSection):
                continue
            for sym in sec.iter_symbols():
                if sym.name and sym["st_shndx"] == "SHN_UNDEF" and sym.name not in ALLOWED_UNDEFINED:
                    what = "a libgcc helper" if sym.name.startswith("__") else "a library function"
                    out.append("%s: calls %s, %s the module cannot link (only mp_fun_table is given)"
                               % (path, sym.name, what))
    return out


def mpy_problems(path, arch):
    """The problems of the .mpy header at path for architecture arch."""
    with open(path, "rb") as f:
        head = f.read(4)
    if len(head) < 4 or head[0:1] != b"M":
        return ["%s: not an .mpy file (header %r)" % (path, head)]
    out = []
    if head[1] != MPY_VERSION or (head[2] & 3) != MPY_SUB_VERSION:
        out.append("%s: .mpy version %d.%d, expected %d.%d" % (path, head[1], head[2] & 3, MPY_VERSION,
                                                                MPY_SUB_VERSION))
    if head[2] >> 2 != ARCHS[arch]:
        names = {v: k for k, v in ARCHS.items()}
        out.append("%s: built for %s, expected %s" % (path, names.get(head[2] >> 2, head[2] >> 2), arch))
    return out


def main(argv):
    if argv[:1] == ["--mpy"]:
        if len(argv) != 3 or argv[1] not in ARCHS:
            print("usage: check_elf.py --mpy ARCH FILE.mpy (ARCH: %s)" % ", ".join(ARCHS))
            return 2
        problems = mpy_problems(argv[2], argv[1])
    elif len(argv) == 1:
        problems = object_problems(argv[0])
    else:
        print("usage: check_elf.py OBJ.o | --mpy ARCH FILE.mpy")
        return 2
    for p in problems:
        print("check_elf: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
