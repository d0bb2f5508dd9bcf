/*
 * Host scratch buffers of the Cobalt operators (every operator decodes its
 * inputs into plain buffers and encodes its result from one).
 *
 * Buffers handed back to malloc one at a time went back to the kernel (glibc
 * maps large blocks and trims the heap's top), so the next operator's buffer
 * faulted its pages in again: a cost set by the order of the sizes asked for,
 * not by the work. A pipeline stage of one block paid about 10% more per
 * block than a stage of sixteen, which no profile of a long stage shows.
 * Freed buffers are kept instead, at most SCRATCH_SLOTS of them and
 * SCRATCH_KEEP_BYTES in all, for the life of the process (as the device
 * arenas are); the smallest kept buffer that fits is reused, and the oldest
 * kept goes first when room is needed. One mutex guards them.
 */

#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cobalt.h"

#define SCRATCH_SLOTS 32
#define SCRATCH_KEEP_BYTES ((size_t)128 << 20)

/* A buffer's usable size, kept in front of it (aligned as malloc aligns). */
typedef union scratch_header {
    size_t size;
    max_align_t align;
} scratch_header;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* The kept buffers' headers, oldest first. */
static scratch_header *g_kept[SCRATCH_SLOTS];
static size_t g_count;
static size_t g_kept_bytes;

static void drop(size_t i) {
    g_kept_bytes -= g_kept[i]->size;
    memmove(&g_kept[i], &g_kept[i + 1], (g_count - i - 1) * sizeof g_kept[0]);
    g_count--;
}

/* The smallest kept buffer of at least `bytes` and at most twice that or a
 * page more (a small request does not take the buffer a large one will want). */
static scratch_header *take(size_t bytes) {
    pthread_mutex_lock(&g_lock);
    size_t best = g_count;
    for (size_t i = 0; i < g_count; i++) {
        size_t size = g_kept[i]->size;
        if (size >= bytes && (size - bytes <= bytes || size - bytes <= 4096) &&
            (best == g_count || size < g_kept[best]->size)) {
            best = i;
        }
    }
    scratch_header *h = NULL;
    if (best < g_count) {
        h = g_kept[best];
        drop(best);
    }
    pthread_mutex_unlock(&g_lock);
    return h;
}

void *cobalt_scratch(const char *op, int64_t count, size_t size, PolychipError **error) {
    if (count < 0 || (uint64_t)count > (SIZE_MAX - sizeof(scratch_header)) / size) {
        *error = cobalt_error(POLYCHIP_ERROR_OUT_OF_MEMORY,
                              "cobalt: %s: a scratch buffer of %" PRId64
                              " %zu-byte elements does not fit in host memory",
                              op, count, size);
        return NULL;
    }
    size_t bytes = count == 0 ? 1 : (size_t)count * size;
    scratch_header *h = take(bytes);
    if (h == NULL) {
        h = malloc(sizeof *h + bytes);
        if (h == NULL) {
            *error = cobalt_error(POLYCHIP_ERROR_OUT_OF_MEMORY,
                                  "cobalt: %s: host memory for a %zu-byte scratch buffer ran out",
                                  op, bytes);
            return NULL;
        }
        h->size = bytes;
    }
    return h + 1;
}

void cobalt_scratch_free(void *buffer) {
    if (buffer == NULL) {
        return;
    }
    scratch_header *h = (scratch_header *)buffer - 1;
    if (h->size > SCRATCH_KEEP_BYTES) {
        free(h);
        return;
    }
    scratch_header *evicted[SCRATCH_SLOTS];
    size_t n = 0;
    pthread_mutex_lock(&g_lock);
    while (g_count > 0 &&
           (g_count == SCRATCH_SLOTS || g_kept_bytes + h->size > SCRATCH_KEEP_BYTES)) {
        evicted[n++] = g_kept[0];
        drop(0);
    }
    g_kept[g_count++] = h;
    g_kept_bytes += h->size;
    pthread_mutex_unlock(&g_lock);
    for (size_t i = 0; i < n; i++) {
        free(evicted[i]);
    }
}
