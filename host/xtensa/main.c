// MicroPython for QEMU's `-M sim -cpu de233_fpu` Xtensa machine (windowed ABI, single-precision
// floats, the xtensawin native emitter). Input and output go through QEMU's Xtensa semihosting
// (`simcall`): the console is the host's stdin/stdout, and the host's files are read and written
// through the `semi` module. The Python files a run needs are copied by boot code (BOOT_PY below)
// from a bundle file made by host/xtensa/run.py into a littlefs file system on a RAM disk mounted
// at /, as on a board's flash.
//
// Command line (QEMU's -append or -semihosting-config arg=...):
//   [--heap BYTES] [--disk BYTES] BUNDLE SCRIPT [ARGS...]
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

#include "py/builtin.h"
#include "py/compile.h"
#include "py/gc.h"
#include "py/mperrno.h"
#include "py/mphal.h"
#include "py/objstr.h"
#include "py/runtime.h"
#include "py/stackctrl.h"
#include "py/stream.h"
#include "py/cstack.h"
#include "extmod/vfs.h"

// ---- semihosting (target/xtensa/xtensa-semi.c in QEMU) ----
#define SYS_EXIT 1
#define SYS_READ 3
#define SYS_WRITE 4
#define SYS_OPEN 5
#define SYS_CLOSE 6
#define SYS_LSEEK 19
#define SYS_ARGC 1000
#define SYS_ARGV_SZ 1001
#define SYS_ARGV 1002
// QEMU passes open()'s flags to the host unchanged: these are Linux's values.
#define H_O_RDONLY 0
#define H_O_WRONLY 1
#define H_O_CREAT 0100
#define H_O_TRUNC 01000

static int semi_errno;

static int semi_call(int nr, int a, int b, int c) {
    register int a2 __asm__ ("a2") = nr;
    register int a3 __asm__ ("a3") = a;
    register int a4 __asm__ ("a4") = b;
    register int a5 __asm__ ("a5") = c;
    __asm__ volatile ("simcall" : "+r" (a2), "+r" (a3) : "r" (a4), "r" (a5) : "memory");
    semi_errno = a3;
    return a2;
}

NORETURN void semi_exit(int code);
NORETURN void semi_exit(int code) {
    for (;;) {
        semi_call(SYS_EXIT, code, 0, 0);
    }
}

static void semi_write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        int n = semi_call(SYS_WRITE, fd, (int)buf, (int)len);
        if (n <= 0) {
            return;
        }
        buf += n;
        len -= n;
    }
}

// ---- console ----
mp_uint_t mp_hal_stdout_tx_strn(const char *str, size_t len) {
    semi_write_all(1, str, len);
    return len;
}

void mp_hal_stdout_tx_str(const char *str) {
    mp_hal_stdout_tx_strn(str, strlen(str));
}

void mp_hal_stdout_tx_strn_cooked(const char *str, size_t len) {
    mp_hal_stdout_tx_strn(str, len);
}

int mp_hal_stdin_rx_chr(void) {
    unsigned char c;
    if (semi_call(SYS_READ, 0, (int)&c, 1) != 1) {
        return 4; // end of input: Ctrl-D
    }
    return c;
}

// input(): a line from the host's stdin (no editing)
int readline(vstr_t *line, const char *prompt);
int readline(vstr_t *line, const char *prompt) {
    mp_hal_stdout_tx_str(prompt);
    for (;;) {
        int c = mp_hal_stdin_rx_chr();
        if (c == 4 && line->len == 0) {
            return c;
        }
        if (c == '\n' || c == 4) {
            return 0;
        }
        vstr_add_byte(line, c);
    }
}

uintptr_t mp_hal_stdio_poll(uintptr_t poll_flags) {
    return poll_flags & MP_STREAM_POLL_WR;
}

// ---- time: the cycle counter of the emulated core (QEMU advances it with the host's clock) ----
#define CCOUNT_HZ (40000000ULL)
static uint64_t ccount_hi;
static uint32_t ccount_last;

static uint64_t ccount64(void) {
    uint32_t c;
    __asm__ volatile ("rsr.ccount %0" : "=a" (c));
    if (c < ccount_last) {
        ccount_hi += 1ULL << 32;
    }
    ccount_last = c;
    return ccount_hi | c;
}

mp_uint_t mp_hal_ticks_ms(void) {
    return (mp_uint_t)(ccount64() / (CCOUNT_HZ / 1000));
}

mp_uint_t mp_hal_ticks_us(void) {
    return (mp_uint_t)(ccount64() / (CCOUNT_HZ / 1000000));
}

mp_uint_t mp_hal_ticks_cpu(void) {
    return (mp_uint_t)ccount64();
}

uint64_t mp_hal_time_ns(void) {
    return ccount64() * 25;
}

void mp_hal_delay_ms(mp_uint_t ms) {
    mp_uint_t t0 = mp_hal_ticks_ms();
    while (mp_hal_ticks_ms() - t0 < ms) {
        mp_handle_pending(true);
    }
}

void mp_hal_delay_us(mp_uint_t us) {
    mp_uint_t t0 = mp_hal_ticks_us();
    while (mp_hal_ticks_us() - t0 < us) {
    }
}

static uint32_t random_state = 1;
void mp_hal_get_random(size_t n, uint8_t *buf) {
    for (size_t i = 0; i < n; ++i) {
        random_state = random_state * 1664525 + 1013904223;
        buf[i] = random_state >> 24;
    }
}

// ---- the `semi` module: host files, the command line, exit ----
static mp_obj_t semi_read(mp_obj_t path_in) {
    const char *path = mp_obj_str_get_str(path_in);
    int fd = semi_call(SYS_OPEN, (int)path, H_O_RDONLY, 0);
    if (fd < 0) {
        mp_raise_OSError(semi_errno);
    }
    int len = semi_call(SYS_LSEEK, fd, 0, 2);
    semi_call(SYS_LSEEK, fd, 0, 0);
    if (len < 0) {
        semi_call(SYS_CLOSE, fd, 0, 0);
        mp_raise_OSError(MP_EIO);
    }
    vstr_t vstr;
    vstr_init_len(&vstr, len);
    int got = 0;
    while (got < len) {
        int n = semi_call(SYS_READ, fd, (int)(vstr.buf + got), len - got);
        if (n <= 0) {
            semi_call(SYS_CLOSE, fd, 0, 0);
            mp_raise_OSError(n < 0 ? semi_errno : MP_EIO);
        }
        got += n;
    }
    semi_call(SYS_CLOSE, fd, 0, 0);
    return mp_obj_new_bytes_from_vstr(&vstr);
}
static MP_DEFINE_CONST_FUN_OBJ_1(semi_read_obj, semi_read);

static mp_obj_t semi_write(mp_obj_t path_in, mp_obj_t data_in) {
    const char *path = mp_obj_str_get_str(path_in);
    mp_buffer_info_t bufinfo;
    mp_get_buffer_raise(data_in, &bufinfo, MP_BUFFER_READ);
    int fd = semi_call(SYS_OPEN, (int)path, H_O_WRONLY | H_O_CREAT | H_O_TRUNC, 0644);
    if (fd < 0) {
        mp_raise_OSError(semi_errno);
    }
    const char *p = bufinfo.buf;
    size_t left = bufinfo.len;
    while (left > 0) {
        int n = semi_call(SYS_WRITE, fd, (int)p, (int)left);
        if (n <= 0) {
            semi_call(SYS_CLOSE, fd, 0, 0);
            mp_raise_OSError(n < 0 ? semi_errno : MP_EIO);
        }
        p += n;
        left -= n;
    }
    semi_call(SYS_CLOSE, fd, 0, 0);
    return mp_obj_new_int(bufinfo.len);
}
static MP_DEFINE_CONST_FUN_OBJ_2(semi_write_obj, semi_write);

static mp_obj_t semi_exit_fn(mp_obj_t code) {
    semi_exit(mp_obj_get_int(code));
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_1(semi_exit_obj, semi_exit_fn);

// A RAM disk for littlefs: the block protocol (readblocks/writeblocks/ioctl) over a memory region
// outside the GC heap.
#define DISK_BLOCK 4096
static uint8_t *disk_base;
static size_t disk_size;

static mp_obj_t disk_readblocks(size_t n_args, const mp_obj_t *args) {
    size_t block = mp_obj_get_int(args[1]);
    mp_buffer_info_t bufinfo;
    mp_get_buffer_raise(args[2], &bufinfo, MP_BUFFER_WRITE);
    size_t off = block * DISK_BLOCK + (n_args > 3 ? mp_obj_get_int(args[3]) : 0);
    if (off + bufinfo.len > disk_size) {
        mp_raise_OSError(MP_EIO);
    }
    memcpy(bufinfo.buf, disk_base + off, bufinfo.len);
    return MP_OBJ_NEW_SMALL_INT(0);
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(disk_readblocks_obj, 3, 4, disk_readblocks);

static mp_obj_t disk_writeblocks(size_t n_args, const mp_obj_t *args) {
    size_t block = mp_obj_get_int(args[1]);
    mp_buffer_info_t bufinfo;
    mp_get_buffer_raise(args[2], &bufinfo, MP_BUFFER_READ);
    size_t off = block * DISK_BLOCK + (n_args > 3 ? mp_obj_get_int(args[3]) : 0);
    if (off + bufinfo.len > disk_size) {
        mp_raise_OSError(MP_EIO);
    }
    memcpy(disk_base + off, bufinfo.buf, bufinfo.len);
    return MP_OBJ_NEW_SMALL_INT(0);
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(disk_writeblocks_obj, 3, 4, disk_writeblocks);

static mp_obj_t disk_ioctl(mp_obj_t self, mp_obj_t op_in, mp_obj_t arg_in) {
    (void)self;
    switch (mp_obj_get_int(op_in)) {
        case MP_BLOCKDEV_IOCTL_BLOCK_COUNT:
            return MP_OBJ_NEW_SMALL_INT(disk_size / DISK_BLOCK);
        case MP_BLOCKDEV_IOCTL_BLOCK_SIZE:
            return MP_OBJ_NEW_SMALL_INT(DISK_BLOCK);
        case MP_BLOCKDEV_IOCTL_BLOCK_ERASE: {
            size_t block = mp_obj_get_int(arg_in);
            if ((block + 1) * DISK_BLOCK > disk_size) {
                return MP_OBJ_NEW_SMALL_INT(-MP_EIO);
            }
            memset(disk_base + block * DISK_BLOCK, 0xff, DISK_BLOCK);
            return MP_OBJ_NEW_SMALL_INT(0);
        }
        default:
            return MP_OBJ_NEW_SMALL_INT(0);
    }
}
static MP_DEFINE_CONST_FUN_OBJ_3(disk_ioctl_obj, disk_ioctl);

static const mp_rom_map_elem_t disk_locals_table[] = {
    { MP_ROM_QSTR(MP_QSTR_readblocks), MP_ROM_PTR(&disk_readblocks_obj) },
    { MP_ROM_QSTR(MP_QSTR_writeblocks), MP_ROM_PTR(&disk_writeblocks_obj) },
    { MP_ROM_QSTR(MP_QSTR_ioctl), MP_ROM_PTR(&disk_ioctl_obj) },
};
static MP_DEFINE_CONST_DICT(disk_locals, disk_locals_table);
static MP_DEFINE_CONST_OBJ_TYPE(semi_ramdisk_type, MP_QSTR_RAMDisk, MP_TYPE_FLAG_NONE,
    locals_dict, &disk_locals);
static const mp_obj_base_t semi_ramdisk_obj = { &semi_ramdisk_type };

static const mp_rom_map_elem_t semi_globals_table[] = {
    { MP_ROM_QSTR(MP_QSTR___name__), MP_ROM_QSTR(MP_QSTR_semi) },
    { MP_ROM_QSTR(MP_QSTR_read), MP_ROM_PTR(&semi_read_obj) },
    { MP_ROM_QSTR(MP_QSTR_write), MP_ROM_PTR(&semi_write_obj) },
    { MP_ROM_QSTR(MP_QSTR_exit), MP_ROM_PTR(&semi_exit_obj) },
    { MP_ROM_QSTR(MP_QSTR_disk), MP_ROM_PTR(&semi_ramdisk_obj) },
};
static MP_DEFINE_CONST_DICT(semi_globals, semi_globals_table);
const mp_obj_module_t semi_module = {
    .base = { &mp_type_module },
    .globals = (mp_obj_dict_t *)&semi_globals,
};
MP_REGISTER_MODULE(MP_QSTR_semi, semi_module);

// ---- boot: a file system on the RAM disk, the bundle's files copied into it ----
// Bundle format (host/xtensa/run.py): b"MFXB1\n", then per file: u16 name length, name (utf-8,
// absolute path), u32 data length, data; all little-endian.
static const char BOOT_PY[] =
    "import semi, vfs, os, sys, struct\n"
    "vfs.VfsLfs2.mkfs(semi.disk)\n"
    "vfs.mount(vfs.VfsLfs2(semi.disk), '/')\n"
    "def _unpack(b):\n"
    "    if b[:6] != b'MFXB1\\n':\n"
    "        raise ValueError('bundle: bad header %r' % bytes(b[:6]))\n"
    "    m = memoryview(b); i = 6; n = len(b)\n"
    "    while i < n:\n"
    "        k = struct.unpack_from('<H', b, i)[0]; i += 2\n"
    "        name = str(m[i:i + k], 'utf-8'); i += k\n"
    "        size = struct.unpack_from('<I', b, i)[0]; i += 4\n"
    "        d = ''\n"
    "        for part in name.split('/')[1:-1]:\n"
    "            d += '/' + part\n"
    "            try:\n"
    "                os.mkdir(d)\n"
    "            except OSError:\n"
    "                pass\n"
    "        with open(name, 'wb') as f:\n"
    "            f.write(m[i:i + size])\n"
    "        i += size\n"
    "_unpack(semi.read(sys.argv[0]))\n"
    "del _unpack\n"
    "sys.argv.pop(0)\n"
    "sys.path[:] = ['', '/lib', '.frozen']\n"
    "os.chdir('/')\n";

static int exec_source(mp_lexer_t *lex_or_null, const char *str, qstr src_name) {
    nlr_buf_t nlr;
    if (nlr_push(&nlr) == 0) {
        mp_lexer_t *lex = lex_or_null ? lex_or_null
            : mp_lexer_new_from_str_len(src_name, str, strlen(str), 0);
        qstr source_name = lex->source_name;
        mp_parse_tree_t pt = mp_parse(lex, MP_PARSE_FILE_INPUT);
        mp_obj_t f = mp_compile(&pt, source_name, false);
        mp_call_function_0(f);
        nlr_pop();
        return 0;
    } else {
        mp_obj_base_t *exc = nlr.ret_val;
        if (mp_obj_is_subclass_fast(MP_OBJ_FROM_PTR(exc->type), MP_OBJ_FROM_PTR(&mp_type_SystemExit))) {
            mp_obj_t val = mp_obj_exception_get_value(MP_OBJ_FROM_PTR(exc));
            if (val == mp_const_none) {
                return 0;
            }
            mp_int_t code;
            if (mp_obj_get_int_maybe(val, &code)) {
                return (int)code & 255;
            }
            mp_obj_print(val, PRINT_STR);
            mp_hal_stdout_tx_str("\n");
            return 1;
        }
        mp_obj_print_exception(&mp_plat_print, MP_OBJ_FROM_PTR(exc));
        return 1;
    }
}

static int run_file(const char *path) {
    nlr_buf_t nlr;
    mp_lexer_t *lex = NULL;
    if (nlr_push(&nlr) == 0) {
        lex = mp_lexer_new_from_file(qstr_from_str(path));
        nlr_pop();
    } else {
        mp_obj_print_exception(&mp_plat_print, MP_OBJ_FROM_PTR(nlr.ret_val));
        return 1;
    }
    mp_store_global(MP_QSTR___name__, MP_OBJ_NEW_QSTR(MP_QSTR___main__));
    return exec_source(lex, NULL, 0);
}

extern char _heap_start[], _ram_end[], _stack_top[], _stack_bottom[];

// a decimal byte count, or 0 when it is not one
static size_t parse_size(const char *s) {
    size_t v = 0;
    if (!*s) {
        return 0;
    }
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > 0x0fffffff) {
            return 0;
        }
        v = v * 10 + (*s - '0');
    }
    return v;
}

void xt_main(void) {
    // the command line from QEMU
    int argc = semi_call(SYS_ARGC, 0, 0, 0);
    int sz = semi_call(SYS_ARGV_SZ, 0, 0, 0);
    static char argbuf[4096] __attribute__((aligned(4)));
    if (argc <= 0 || sz <= 0 || sz > (int)sizeof(argbuf)) {
        mp_hal_stdout_tx_str("xtensa-port: no command line (QEMU -append 'BUNDLE SCRIPT ...')\n");
        semi_exit(2);
    }
    semi_call(SYS_ARGV, (int)argbuf, 0, 0);
    char **argv = (char **)argbuf;
    // argv[0] is the kernel file when QEMU builds the command line from -kernel/-append
    int a = 1;
    size_t heap_size = 8 * 1024 * 1024;
    size_t disk_bytes = 4 * 1024 * 1024;
    while (a + 1 < argc && argv[a][0] == '-' && argv[a][1] == '-') {
        if (strcmp(argv[a], "--heap") == 0) {
            heap_size = parse_size(argv[a + 1]);
        } else if (strcmp(argv[a], "--disk") == 0) {
            disk_bytes = parse_size(argv[a + 1]);
        } else {
            mp_hal_stdout_tx_str("xtensa-port: unknown option ");
            mp_hal_stdout_tx_str(argv[a]);
            mp_hal_stdout_tx_str("\n");
            semi_exit(2);
        }
        a += 2;
    }
    if (argc - a < 2) {
        mp_hal_stdout_tx_str("xtensa-port: usage: [--heap BYTES] [--disk BYTES] BUNDLE SCRIPT [ARGS...]\n");
        semi_exit(2);
    }
    size_t avail = (size_t)(_ram_end - _heap_start);
    disk_bytes &= ~(size_t)(DISK_BLOCK - 1);
    if (heap_size + disk_bytes > avail || disk_bytes < 16 * DISK_BLOCK || heap_size < 65536) {
        mp_hal_stdout_tx_str("xtensa-port: --heap + --disk do not fit in RAM (QEMU -m)\n");
        semi_exit(2);
    }
    char *heap = _heap_start;
    disk_base = (uint8_t *)(_ram_end - disk_bytes);
    disk_size = disk_bytes;

    mp_cstack_init_with_top(_stack_top, (size_t)(_stack_top - _stack_bottom) - 4096);
    gc_init(heap, heap + heap_size);
    mp_init();
    for (int i = a; i < argc; i++) {
        mp_obj_list_append(mp_sys_argv, mp_obj_new_str(argv[i], strlen(argv[i])));
    }
    int ret = exec_source(NULL, BOOT_PY, MP_QSTR__lt_stdin_gt_);
    if (ret == 0) {
        ret = run_file(argv[a + 1]);
    }
    gc_sweep_all();
    mp_deinit();
    semi_exit(ret);
}

// ---- garbage collection: spill the register windows, then scan the C stack ----
void xt_spill_windows(void);

void gc_collect(void) {
    gc_collect_start();
    xt_spill_windows();
    uintptr_t sp;
    __asm__ volatile ("mov %0, a1" : "=a" (sp));
    sp -= 64; // the save areas of this frame's callers' a0..a3 lie just below the callee's sp
    sp &= ~(uintptr_t)3;
    gc_collect_root((void **)sp, ((uintptr_t)_stack_top - sp) / sizeof(uintptr_t));
    gc_collect_end();
}

void nlr_jump_fail(void *val) {
    (void)val;
    mp_hal_stdout_tx_str("xtensa-port: uncaught NLR\n");
    semi_exit(3);
}

void NORETURN __fatal_error(const char *msg) {
    mp_hal_stdout_tx_str("xtensa-port: fatal error: ");
    mp_hal_stdout_tx_str(msg);
    mp_hal_stdout_tx_str("\n");
    semi_exit(3);
}

#ifndef NDEBUG
void MP_WEAK __assert_func(const char *file, int line, const char *func, const char *expr) {
    mp_printf(&mp_plat_print, "Assertion '%s' failed, at file %s:%d\n", expr, file, line);
    __fatal_error("assertion failed");
}
#endif

static void put_hex(const char *label, uint32_t v) {
    char buf[12];
    mp_hal_stdout_tx_str(label);
    for (int i = 0; i < 8; i++) {
        buf[i] = "0123456789abcdef"[(v >> (28 - 4 * i)) & 15];
    }
    buf[8] = 0;
    mp_hal_stdout_tx_str(buf);
}

// Called from the exception vectors (startup.S) on any exception other than a window
// overflow/underflow: an illegal instruction (for example one this emulated core lacks), a bad
// load or store. Prints the cause and exits with status 4.
void xt_fatal(uint32_t cause, uint32_t epc, uint32_t vaddr, uint32_t vector) {
    mp_hal_stdout_tx_str("\nxtensa-port: CPU exception");
    put_hex(" vector ", vector);
    put_hex(" EXCCAUSE ", cause);
    put_hex(vector == 2 ? " DEPC " : " EPC1 ", epc);
    put_hex(" EXCVADDR ", vaddr);
    mp_hal_stdout_tx_str(cause == 0 ? " (illegal instruction)\n" : "\n");
    semi_exit(4);
}
