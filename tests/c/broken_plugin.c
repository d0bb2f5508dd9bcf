/*
 * Plugins that take down the process that loads them, one variant per -D
 * flag, compiled by the CLI's tests (cli/tests/devices.rs) to check that
 * `polychip devices` and `polychip conform` load every plugin in a child
 * process first and report the one that crashed or hung by name.
 *
 *   BROKEN_INIT_SEGV    the entry function writes through a NULL pointer
 *   BROKEN_INIT_ABORT   the entry function calls abort()
 *   BROKEN_INIT_HANG    the entry function never returns
 *   BROKEN_CTOR_SEGV    a constructor crashes inside dlopen itself
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "polychip.h"

#ifdef BROKEN_CTOR_SEGV
__attribute__((constructor)) static void crash_on_load(void) {
    *(volatile int *)0 = 1;
}
#endif

POLYCHIP_EXPORT PolychipError *polychip_plugin_init_v1(const PolychipHostApi *host, const PolychipPluginApi **out_plugin);
PolychipError *polychip_plugin_init_v1(const PolychipHostApi *host, const PolychipPluginApi **out_plugin) {
    (void)host;
    (void)out_plugin;
#if defined(BROKEN_INIT_SEGV)
    *(volatile int *)0 = 1;
#elif defined(BROKEN_INIT_ABORT)
    abort();
#elif defined(BROKEN_INIT_HANG)
    for (;;) pause();
#endif
    return NULL;
}
