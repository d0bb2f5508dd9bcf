/*
 * Device memory of the Cobalt plugin: one private arena per device, a
 * first-fit allocator inside it, the byte encoding, and the three copies.
 *
 * Each device's arena is a single aligned_alloc of the configured capacity,
 * made at the device's first allocation (Linux overcommit keeps untouched
 * pages free). Device addresses are real addresses inside the arena, but the
 * bytes are stored encoded: the byte at arena offset o holds
 *     plain XOR key(o),  key(o) = (uint8_t)(0xA5 ^ (o * 131) ^ (o >> 8)),
 * so a host that dereferences a device pointer instead of calling memcpy_d2h
 * reads garbage, just as it would on a chip whose memory is not host-visible.
 * Only the copies below and the operators (through cobalt_xcode) decode.
 *
 * The allocator keeps, outside the arena, an array of blocks sorted by offset
 * that covers the whole arena; allocations are rounded up to 64 bytes (so
 * every block starts 64-byte aligned), the first free block that fits is
 * split, and a freed block merges with free neighbours. A mutex per device
 * guards the blocks; the arena base never changes once set.
 *
 * Every device range a caller passes (copies, tensor extents) must lie inside
 * one live allocation (within the bytes requested); anything else, including
 * freed memory and host pointers, is INVALID_ARGUMENT and is never touched.
 */

#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cobalt.h"

typedef struct block {
    uint64_t offset;    /* from the arena base; a multiple of 64 */
    uint64_t size;      /* a multiple of 64 */
    uint64_t requested; /* bytes asked for; 0 for a free block */
    int free;
} block;

typedef struct arena {
    pthread_mutex_t lock;
    uint8_t *base; /* NULL until the first allocation */
    uint64_t used; /* bytes in allocated blocks */
    block *blocks; /* sorted by offset, covering [0, capacity) once base is set */
    size_t count;
    size_t room;
} arena;

static arena g_arenas[COBALT_MAX_DEVICES];
static uint64_t g_capacity;
/* key(o) = g_key[o & 255] ^ ((o >> 8) & 255): the (o * 131) term only
 * depends on o's low byte. */
static uint8_t g_key[256];

/* ---- encoding ------------------------------------------------------------ */

static uint8_t key_of(uint64_t offset) {
    return (uint8_t)(0xA5u ^ (offset * 131u) ^ (offset >> 8));
}

void cobalt_xcode(uint8_t *dst, const uint8_t *src, uint64_t offset, size_t n) {
    while (n > 0) {
        /* Within one 256-byte period the key is g_key[j..] ^ one byte m. */
        size_t j = (size_t)(offset & 255u);
        size_t run = 256u - j < n ? 256u - j : n;
        uint8_t m = (uint8_t)(offset >> 8);
        uint64_t m_word = (uint64_t)m * 0x0101010101010101ull;
        size_t i = 0;
        for (; i + 8 <= run; i += 8) {
            uint64_t word;
            uint64_t key;
            memcpy(&word, src + i, 8);
            memcpy(&key, g_key + j + i, 8);
            word ^= key ^ m_word;
            memcpy(dst + i, &word, 8);
        }
        for (; i < run; i++) {
            dst[i] = (uint8_t)(src[i] ^ g_key[j + i] ^ m);
        }
        dst += run;
        src += run;
        offset += run;
        n -= run;
    }
}

void cobalt_memory_init(uint64_t capacity_bytes) {
    for (unsigned o = 0; o < 256u; o++) {
        g_key[o] = key_of(o);
    }
    for (unsigned d = 0; d < COBALT_MAX_DEVICES; d++) {
        pthread_mutex_init(&g_arenas[d].lock, NULL);
    }
    g_capacity = capacity_bytes;
}

uint64_t cobalt_memory_capacity(void) { return g_capacity; }

/* ---- the allocator (callers hold the arena's lock) ----------------------- */

/* Makes room for one more block; 0 when host memory ran out. */
static int reserve_block(arena *a) {
    if (a->count < a->room) {
        return 1;
    }
    size_t room = a->room == 0 ? 64 : a->room * 2;
    block *blocks = realloc(a->blocks, room * sizeof *blocks);
    if (blocks == NULL) {
        return 0;
    }
    a->blocks = blocks;
    a->room = room;
    return 1;
}

static void remove_block(arena *a, size_t i) {
    memmove(&a->blocks[i], &a->blocks[i + 1], (a->count - i - 1) * sizeof *a->blocks);
    a->count--;
}

/* Index of the block containing `offset` (< capacity). */
static size_t find_block(const arena *a, uint64_t offset) {
    size_t lo = 0;
    size_t hi = a->count;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (a->blocks[mid].offset <= offset) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* Sets up the arena at its first allocation; an error message or NULL. */
static const char *open_arena(arena *a) {
    if (a->base != NULL) {
        return NULL;
    }
    if (!reserve_block(a)) {
        return "host memory for the allocator's bookkeeping ran out";
    }
    a->base = aligned_alloc(COBALT_ALIGNMENT, (size_t)g_capacity);
    if (a->base == NULL) {
        return "the host could not reserve the device's arena";
    }
    a->blocks[0] = (block){.offset = 0, .size = g_capacity, .requested = 0, .free = 1};
    a->count = 1;
    a->used = 0;
    return NULL;
}

static uint64_t largest_free_block(const arena *a) {
    uint64_t largest = 0;
    for (size_t i = 0; i < a->count; i++) {
        if (a->blocks[i].free && a->blocks[i].size > largest) {
            largest = a->blocks[i].size;
        }
    }
    return largest;
}

PolychipError *cobalt_mem_alloc(uint32_t device, uint64_t bytes, void **out_ptr) {
    PolychipError *error = cobalt_check_device(device, "mem_alloc");
    if (error != NULL) {
        return error;
    }
    if (out_ptr == NULL) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT, "cobalt: mem_alloc: out_ptr is NULL");
    }
    if (bytes == 0) {
        *out_ptr = NULL;
        return NULL;
    }
    arena *a = &g_arenas[device];
    pthread_mutex_lock(&a->lock);
    const char *problem = open_arena(a);
    if (problem != NULL) {
        pthread_mutex_unlock(&a->lock);
        return cobalt_error(POLYCHIP_ERROR_OUT_OF_MEMORY,
                            "cobalt: mem_alloc: device %u: %s (%" PRIu64 " bytes)", (unsigned)device,
                            problem, g_capacity);
    }
    uint64_t free_bytes = g_capacity - a->used;
    if (bytes > free_bytes) {
        pthread_mutex_unlock(&a->lock);
        return cobalt_error(POLYCHIP_ERROR_OUT_OF_MEMORY,
                            "cobalt: mem_alloc: device %u: requested %" PRIu64 " bytes but only %" PRIu64
                            " of its %" PRIu64 " bytes are free",
                            (unsigned)device, bytes, free_bytes, g_capacity);
    }
    /* bytes <= free_bytes, a multiple of 64, so rounding cannot overflow. */
    uint64_t size = (bytes + COBALT_ALIGNMENT - 1u) / COBALT_ALIGNMENT * COBALT_ALIGNMENT;
    size_t i = 0;
    while (i < a->count && !(a->blocks[i].free && a->blocks[i].size >= size)) {
        i++;
    }
    if (i == a->count) {
        uint64_t largest = largest_free_block(a);
        pthread_mutex_unlock(&a->lock);
        return cobalt_error(POLYCHIP_ERROR_OUT_OF_MEMORY,
                            "cobalt: mem_alloc: device %u: requested %" PRIu64 " bytes; %" PRIu64
                            " of its %" PRIu64 " bytes are free but fragmented, the largest free "
                            "block is %" PRIu64 " bytes",
                            (unsigned)device, bytes, free_bytes, g_capacity, largest);
    }
    if (a->blocks[i].size > size) {
        if (!reserve_block(a)) {
            pthread_mutex_unlock(&a->lock);
            return cobalt_error(POLYCHIP_ERROR_OUT_OF_MEMORY,
                                "cobalt: mem_alloc: device %u: host memory for the allocator's "
                                "bookkeeping ran out",
                                (unsigned)device);
        }
        memmove(&a->blocks[i + 2], &a->blocks[i + 1], (a->count - i - 1) * sizeof *a->blocks);
        a->blocks[i + 1] = (block){.offset = a->blocks[i].offset + size,
                                   .size = a->blocks[i].size - size,
                                   .requested = 0,
                                   .free = 1};
        a->blocks[i].size = size;
        a->count++;
    }
    a->blocks[i].free = 0;
    a->blocks[i].requested = bytes;
    a->used += size;
    uint64_t offset = a->blocks[i].offset;
    uint64_t now_free = g_capacity - a->used;
    void *ptr = a->base + offset;
    pthread_mutex_unlock(&a->lock);
    cobalt_log(POLYCHIP_LOG_DEBUG,
               "cobalt: device %u: allocated %" PRIu64 " bytes at offset %" PRIu64 " (%" PRIu64
               " of %" PRIu64 " bytes free)",
               (unsigned)device, bytes, offset, now_free, g_capacity);
    *out_ptr = ptr;
    return NULL;
}

PolychipError *cobalt_mem_free(uint32_t device, void *ptr) {
    PolychipError *error = cobalt_check_device(device, "mem_free");
    if (error != NULL) {
        return error;
    }
    if (ptr == NULL) {
        return NULL;
    }
    arena *a = &g_arenas[device];
    uintptr_t addr = (uintptr_t)ptr;
    pthread_mutex_lock(&a->lock);
    uintptr_t base = (uintptr_t)a->base;
    if (a->base == NULL || addr < base || addr - base >= g_capacity) {
        pthread_mutex_unlock(&a->lock);
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: mem_free: %p is not an address in device %u's memory", ptr,
                            (unsigned)device);
    }
    uint64_t offset = (uint64_t)(addr - base);
    size_t i = find_block(a, offset);
    block *b = &a->blocks[i];
    if (b->offset != offset || b->free) {
        uint64_t start = b->offset;
        int is_free = b->free;
        pthread_mutex_unlock(&a->lock);
        if (is_free) {
            return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                                "cobalt: mem_free: %p (device %u, offset %" PRIu64
                                ") is not a live allocation; was it freed already?",
                                ptr, (unsigned)device, offset);
        }
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: mem_free: %p (device %u, offset %" PRIu64
                            ") is inside the allocation starting at offset %" PRIu64
                            ", not at its start",
                            ptr, (unsigned)device, offset, start);
    }
    uint64_t size = b->size;
    b->free = 1;
    b->requested = 0;
    a->used -= size;
    if (i + 1 < a->count && a->blocks[i + 1].free) {
        a->blocks[i].size += a->blocks[i + 1].size;
        remove_block(a, i + 1);
    }
    if (i > 0 && a->blocks[i - 1].free) {
        a->blocks[i - 1].size += a->blocks[i].size;
        remove_block(a, i);
    }
    uint64_t now_free = g_capacity - a->used;
    pthread_mutex_unlock(&a->lock);
    cobalt_log(POLYCHIP_LOG_DEBUG,
               "cobalt: device %u: freed %" PRIu64 " bytes at offset %" PRIu64 " (%" PRIu64 " of %" PRIu64
               " bytes free)",
               (unsigned)device, size, offset, now_free, g_capacity);
    return NULL;
}

/* ---- address checks ------------------------------------------------------ */

PolychipError *cobalt_check_range(uint32_t device, const char *what, uintptr_t addr, uint64_t len,
                                  uint8_t **out_arena, uint64_t *out_offset) {
    arena *a = &g_arenas[device];
    pthread_mutex_lock(&a->lock);
    uintptr_t base = (uintptr_t)a->base;
    if (a->base == NULL || addr < base || addr - base >= g_capacity ||
        len > g_capacity - (uint64_t)(addr - base)) {
        pthread_mutex_unlock(&a->lock);
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: the %" PRIu64 " bytes at %p are not inside device %u's memory",
                            what, len, (void *)addr, (unsigned)device);
    }
    uint64_t offset = (uint64_t)(addr - base);
    uint8_t *arena_base = a->base;
    const block *b = &a->blocks[find_block(a, offset)];
    uint64_t start = b->offset;
    uint64_t requested = b->requested;
    int is_free = b->free;
    pthread_mutex_unlock(&a->lock);
    if (is_free) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: %p (device %u, offset %" PRIu64
                            ") is not inside a live allocation; was it freed?",
                            what, (void *)addr, (unsigned)device, offset);
    }
    if (offset - start >= requested || len > requested - (offset - start)) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: the %" PRIu64 " bytes at offset %" PRIu64
                            " of device %u run past the end of their allocation (%" PRIu64
                            " bytes at offset %" PRIu64 ")",
                            what, len, offset, (unsigned)device, requested, start);
    }
    *out_arena = arena_base;
    *out_offset = offset;
    return NULL;
}

/* Whether host range [addr, addr + len) overlaps any device's arena. */
static int overlaps_an_arena(uintptr_t addr, uint64_t len) {
    for (unsigned d = 0; d < COBALT_MAX_DEVICES; d++) {
        arena *a = &g_arenas[d];
        pthread_mutex_lock(&a->lock);
        uintptr_t base = (uintptr_t)a->base;
        int overlaps = a->base != NULL &&
                       (addr >= base ? addr - base < g_capacity : (uint64_t)(base - addr) < len);
        pthread_mutex_unlock(&a->lock);
        if (overlaps) {
            return 1;
        }
    }
    return 0;
}

/* ---- copies -------------------------------------------------------------- */

static PolychipError *copy_prologue(const char *what, uint32_t device, const PolychipStream *stream,
                                    const void *dst, const void *src, uint64_t bytes) {
    PolychipError *error = cobalt_check_device(device, what);
    if (error == NULL) {
        error = cobalt_check_stream(device, stream, what);
    }
    if (error == NULL && bytes > 0 && (dst == NULL || src == NULL)) {
        error = cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT, "cobalt: %s: %s is NULL", what,
                             dst == NULL ? "dst" : "src");
    }
    if (error == NULL && bytes > SIZE_MAX) {
        error = cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                             "cobalt: %s: %" PRIu64 " bytes do not fit in this host's address space",
                             what, bytes);
    }
    return error;
}

/* The copy itself: the arguments have passed copy_prologue, and bytes > 0. */
static PolychipError *copy_h2d(uint32_t device, void *dst, const void *src, uint64_t bytes) {
    if (overlaps_an_arena((uintptr_t)src, bytes)) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: memcpy_h2d: src %p is a cobalt device address, not host memory; "
                            "use memcpy_d2d between device addresses",
                            src);
    }
    uint8_t *arena_base;
    uint64_t offset;
    PolychipError *error =
        cobalt_check_range(device, "memcpy_h2d: dst", (uintptr_t)dst, bytes, &arena_base, &offset);
    if (error != NULL) {
        return error;
    }
    cobalt_xcode(arena_base + offset, src, offset, (size_t)bytes);
    return NULL;
}

/* The copy itself: the arguments have passed copy_prologue, and bytes > 0. */
static PolychipError *copy_d2h(uint32_t device, void *dst, const void *src, uint64_t bytes) {
    if (overlaps_an_arena((uintptr_t)dst, bytes)) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: memcpy_d2h: dst %p is a cobalt device address, not host memory; "
                            "use memcpy_d2d between device addresses",
                            dst);
    }
    uint8_t *arena_base;
    uint64_t offset;
    PolychipError *error =
        cobalt_check_range(device, "memcpy_d2h: src", (uintptr_t)src, bytes, &arena_base, &offset);
    if (error != NULL) {
        return error;
    }
    cobalt_xcode(dst, arena_base + offset, offset, (size_t)bytes);
    return NULL;
}

/* The copy itself: the arguments have passed copy_prologue, and bytes > 0. */
static PolychipError *copy_d2d(uint32_t device, void *dst, const void *src, uint64_t bytes) {
    uint8_t *arena_base;
    uint64_t src_offset;
    uint64_t dst_offset;
    PolychipError *error = cobalt_check_range(device, "memcpy_d2d: src", (uintptr_t)src, bytes, &arena_base,
                               &src_offset);
    if (error == NULL) {
        error = cobalt_check_range(device, "memcpy_d2d: dst", (uintptr_t)dst, bytes, &arena_base,
                                   &dst_offset);
    }
    if (error != NULL) {
        return error;
    }
    if (src_offset < dst_offset + bytes && dst_offset < src_offset + bytes) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: memcpy_d2d: the source (offset %" PRIu64 ") and destination (offset %" PRIu64
                            ") ranges of %" PRIu64 " bytes overlap",
                            src_offset, dst_offset, bytes);
    }
    /* Decode a chunk into plain bytes, then encode it at the destination. */
    uint8_t chunk[4096];
    uint64_t done = 0;
    while (done < bytes) {
        size_t n = bytes - done < sizeof chunk ? (size_t)(bytes - done) : sizeof chunk;
        cobalt_xcode(chunk, arena_base + src_offset + done, src_offset + done, n);
        cobalt_xcode(arena_base + dst_offset + done, chunk, dst_offset + done, n);
        done += n;
    }
    return NULL;
}

/* The copies as the plugin exports them: each holds its stream for the
 * copy (strict streams; see cobalt_stream_enter). */
typedef PolychipError *(*copy_fn)(uint32_t, void *, const void *, uint64_t);

static PolychipError *claimed(copy_fn copy, const char *what, uint32_t device, PolychipStream *stream,
                              void *dst, const void *src, uint64_t bytes) {
    PolychipError *error = copy_prologue(what, device, stream, dst, src, bytes);
    if (error == NULL && bytes > 0) {
        error = cobalt_stream_enter(device, stream, what);
    }
    if (error != NULL || bytes == 0) {
        return error;
    }
    error = copy(device, dst, src, bytes);
    cobalt_stream_leave(device, stream);
    return error;
}

PolychipError *cobalt_memcpy_h2d(uint32_t device, PolychipStream *stream, void *dst, const void *src,
                                 uint64_t bytes) {
    return claimed(copy_h2d, "memcpy_h2d", device, stream, dst, src, bytes);
}

PolychipError *cobalt_memcpy_d2h(uint32_t device, PolychipStream *stream, void *dst, const void *src,
                                 uint64_t bytes) {
    return claimed(copy_d2h, "memcpy_d2h", device, stream, dst, src, bytes);
}

PolychipError *cobalt_memcpy_d2d(uint32_t device, PolychipStream *stream, void *dst, const void *src,
                                 uint64_t bytes) {
    return claimed(copy_d2d, "memcpy_d2d", device, stream, dst, src, bytes);
}
