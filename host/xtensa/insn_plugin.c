/* A QEMU TCG plugin that counts the instructions the emulated CPU executes, for
 * host/xtensa/run.py --count-insns. Debian's QEMU 7.2 supports plugins but ships neither its
 * contrib plugins (libinsn.so) nor the plugin header, so the few declarations of QEMU's plugin
 * API (version 1, include/qemu/qemu-plugin.h of QEMU 7.2) this needs are written here.
 *
 * Every translated block adds its instruction count to a counter each time it runs (an inline
 * add, no callback), and at exit `insns: N` goes to QEMU's log (-d plugin -D FILE).
 * QEMU counts executed instructions, not cycles. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stddef.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op,
    void *ptr, uint64_t imm);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
void qemu_plugin_outs(const char *string);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

static uint64_t insn_count;

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insn_count,
        qemu_plugin_tb_n_insns(tb));
}

static void at_exit(qemu_plugin_id_t id, void *p) {
    (void)id;
    (void)p;
    char buf[64];
    snprintf(buf, sizeof buf, "insns: %" PRIu64 "\n", insn_count);
    qemu_plugin_outs(buf);
}

__attribute__((visibility("default")))
int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    (void)info;
    (void)argc;
    (void)argv;
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_atexit_cb(id, at_exit, NULL);
    return 0;
}
