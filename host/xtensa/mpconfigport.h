// MicroPython on QEMU's `-M sim -cpu de233_fpu` Xtensa core, configured like the ESP32-S3 firmware
// where it matters to microformer: 32-bit words, single-precision floats, the xtensawin native
// emitter (viper and native functions compile to Xtensa code at run time), .mpy files with
// xtensawin native code (mpy-cross -march=xtensawin and dynamic native modules), littlefs.
#include <stdint.h>
#include <alloca.h>

#define MICROPY_CONFIG_ROM_LEVEL            (MICROPY_CONFIG_ROM_LEVEL_EXTRA_FEATURES)

#define MICROPY_EMIT_XTENSAWIN              (1)
#define MICROPY_EMIT_INLINE_XTENSA          (0)
#define MICROPY_MAKE_POINTER_CALLABLE(p)    ((void *)((mp_uint_t)(p)))
#define MICROPY_PERSISTENT_CODE_LOAD        (1)
#define MICROPY_NLR_SETJMP                  (1)

#define MICROPY_ENABLE_GC                   (1)
#define MICROPY_STACK_CHECK                 (1)
#define MICROPY_ENABLE_EMERGENCY_EXCEPTION_BUF (1)
#define MICROPY_EMERGENCY_EXCEPTION_BUF_SIZE (256)
#define MICROPY_MALLOC_USES_ALLOCATED_SIZE  (1)
#define MICROPY_MEM_STATS                   (1)
#define MICROPY_LONGINT_IMPL                (MICROPY_LONGINT_IMPL_MPZ)
#define MICROPY_FLOAT_IMPL                  (MICROPY_FLOAT_IMPL_FLOAT)
#define MICROPY_WARNINGS                    (1)
#define MICROPY_USE_INTERNAL_PRINTF         (1)
#define MICROPY_USE_INTERNAL_ERRNO          (1)

#define MICROPY_READER_VFS                  (1)
#define MICROPY_VFS                         (1)
#define MICROPY_PY_OS                       (1)
#define MICROPY_PY_OS_UNAME                 (1)
#define MICROPY_HW_BOARD_NAME               "qemu-xtensa-sim"
#define MICROPY_HW_MCU_NAME                 "de233_fpu"
#define MICROPY_PY_SYS_PLATFORM             "esp32"
#define MICROPY_PY_SYS_ARGV                 (1)
#define MICROPY_PY_TIME                     (1)
#define MICROPY_PY_TIME_TIME_TIME_NS        (1)
#define MICROPY_PY_TIME_INCLUDEFILE         "modtime_port.c"
#define MICROPY_PY_RANDOM_SEED_INIT_FUNC    (12345)
#define MICROPY_PY_MACHINE                  (0)
#define MICROPY_PY_SELECT                   (0)
#define MICROPY_PY_ASYNCIO                  (0)
#define MICROPY_PY_THREAD                   (0)
#define MICROPY_PY_SOCKET                   (0)
#define MICROPY_PY_NETWORK                  (0)
#define MICROPY_PY_SSL                      (0)
#define MICROPY_PY_BLUETOOTH                (0)
#define MICROPY_PY_OS_DUPTERM               (0)
#define MICROPY_PY_WEBREPL                  (0)
#define MICROPY_PY_FRAMEBUF                 (0)
#define MICROPY_PY_BTREE                    (0)
#define MICROPY_PY_ONEWIRE                  (0)
#define MICROPY_PY_LWIP                     (0)
#define MICROPY_PY_CRYPTOLIB                (0)
#define MICROPY_PY_HASHLIB                  (1)

#define MP_SSIZE_MAX (0x7fffffff)
typedef long mp_off_t;
#define MP_NEED_LOG2 (1)
#define MP_STATE_PORT MP_STATE_VM
