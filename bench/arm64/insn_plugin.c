/* A QEMU TCG plugin that counts the guest instructions executed (docs/arm64.md,
 * bench/arm64_insn_count.sh). Debian 12's qemu-user can load plugins (-plugin) but ships
 * neither the contrib plugins nor <qemu-plugin.h>, so the few entry points used here are
 * declared below from the documented plugin API (version 1, QEMU 7.x). Each translated block
 * gets an inline "add its instruction count to a counter" op, so the count is exact for
 * single-threaded guests (run peng with --threads 1; the inline add is not atomic). At exit
 * the total is written to stderr as "insn_count: N". Built for the host:
 *   cc -O2 -shared -fPIC -o insn_plugin.so insn_plugin.c */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb* tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void* userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id,
                                           qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb* tb, enum qemu_plugin_op op,
                                              void* ptr, uint64_t imm);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb* tb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb,
                                    void* userdata);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

static uint64_t insn_count;

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb* tb) {
  (void)id;
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insn_count,
                                           qemu_plugin_tb_n_insns(tb));
}

static void at_exit_cb(qemu_plugin_id_t id, void* userdata) {
  (void)id;
  (void)userdata;
  fprintf(stderr, "insn_count: %llu\n", (unsigned long long)insn_count);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id,
                                                               const struct qemu_info_t* info,
                                                               int argc, char** argv) {
  (void)info;
  (void)argc;
  (void)argv;
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
  qemu_plugin_register_atexit_cb(id, at_exit_cb, NULL);
  return 0;
}
