/*
 * Streams and events of the Cobalt plugin.
 *
 * Cobalt executes every call synchronously: all work enqueued on a stream has
 * completed before the enqueuing call returns. A stream is therefore only a
 * small object remembering its device, an event is always complete once
 * recorded (and a new one counts as complete), synchronizing returns at once
 * and waiting on an event is a no-op once the arguments have been checked.
 * Handles carry a magic number so that a foreign or destroyed handle is
 * usually reported instead of used.
 */

#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "cobalt.h"

#define STREAM_MAGIC 0x436f5374u /* "CoSt" */
#define EVENT_MAGIC 0x436f4576u  /* "CoEv" */
#define DEAD_MAGIC 0xdeadc0deu

struct PolychipStream {
    uint32_t magic;
    uint32_t device;
    /* Copies running on it (strict streams). */
    atomic_int busy;
};

static int g_strict;
/* Copies running on each device's default stream (strict streams). */
static atomic_int g_default_busy[COBALT_MAX_DEVICES];

void cobalt_set_strict_streams(int on) { g_strict = on; }

static atomic_int *busy_counter(uint32_t device, PolychipStream *stream) {
    return stream != NULL ? &stream->busy : &g_default_busy[device];
}

PolychipError *cobalt_stream_enter(uint32_t device, PolychipStream *stream, const char *what) {
    if (!g_strict) {
        return NULL;
    }
    atomic_int *busy = busy_counter(device, stream);
    if (atomic_fetch_add(busy, 1) != 0) {
        atomic_fetch_sub(busy, 1);
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: %s of device %u is in use by another thread's copy "
                            "(POLYCHIP_COBALT_STRICT_STREAMS): the ABI asks callers to serialize "
                            "one stream's calls",
                            what, stream == NULL ? "the default stream" : "a stream",
                            (unsigned)device);
    }
    /* Long enough for a second thread on the same stream to be caught. */
    struct timespec pause = {0, 200000};
    nanosleep(&pause, NULL);
    return NULL;
}

void cobalt_stream_leave(uint32_t device, PolychipStream *stream) {
    if (g_strict) {
        atomic_fetch_sub(busy_counter(device, stream), 1);
    }
}

struct PolychipEvent {
    uint32_t magic;
    uint32_t device;
};

static PolychipError *check_stream_handle(const PolychipStream *stream, const char *what) {
    if (stream->magic != STREAM_MAGIC) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: %p is not a live cobalt stream (destroyed, or from another "
                            "plugin)",
                            what, (const void *)stream);
    }
    return NULL;
}

static PolychipError *check_event(const PolychipEvent *event, const char *what) {
    if (event == NULL) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT, "cobalt: %s: event is NULL", what);
    }
    if (event->magic != EVENT_MAGIC) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: %p is not a live cobalt event (destroyed, or from another "
                            "plugin)",
                            what, (const void *)event);
    }
    return NULL;
}

PolychipError *cobalt_check_stream(uint32_t device, const PolychipStream *stream, const char *what) {
    if (stream == NULL) {
        return NULL; /* the device's default stream */
    }
    PolychipError *error = check_stream_handle(stream, what);
    if (error != NULL) {
        return error;
    }
    if (stream->device != device) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: %s: the stream belongs to device %u but the call is for device %u",
                            what, (unsigned)stream->device, (unsigned)device);
    }
    return NULL;
}

PolychipError *cobalt_stream_create(uint32_t device, PolychipStream **out_stream) {
    PolychipError *error = cobalt_check_device(device, "stream_create");
    if (error != NULL) {
        return error;
    }
    if (out_stream == NULL) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT, "cobalt: stream_create: out_stream is NULL");
    }
    PolychipStream *stream = malloc(sizeof *stream);
    if (stream == NULL) {
        return cobalt_error(POLYCHIP_ERROR_OUT_OF_MEMORY,
                            "cobalt: stream_create: host memory for a %zu-byte stream object ran out",
                            sizeof *stream);
    }
    stream->magic = STREAM_MAGIC;
    stream->device = device;
    atomic_init(&stream->busy, 0);
    *out_stream = stream;
    return NULL;
}

PolychipError *cobalt_stream_destroy(PolychipStream *stream) {
    if (stream == NULL) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                            "cobalt: stream_destroy: stream is NULL (the default stream cannot be "
                            "destroyed)");
    }
    PolychipError *error = check_stream_handle(stream, "stream_destroy");
    if (error != NULL) {
        return error;
    }
    stream->magic = DEAD_MAGIC;
    free(stream);
    return NULL;
}

/* NULL is the default stream, whose work is always complete: success. */
PolychipError *cobalt_stream_synchronize(PolychipStream *stream) {
    if (stream == NULL) {
        return NULL;
    }
    return check_stream_handle(stream, "stream_synchronize");
}

PolychipError *cobalt_event_create(uint32_t device, PolychipEvent **out_event) {
    PolychipError *error = cobalt_check_device(device, "event_create");
    if (error != NULL) {
        return error;
    }
    if (out_event == NULL) {
        return cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT, "cobalt: event_create: out_event is NULL");
    }
    PolychipEvent *event = malloc(sizeof *event);
    if (event == NULL) {
        return cobalt_error(POLYCHIP_ERROR_OUT_OF_MEMORY,
                            "cobalt: event_create: host memory for a %zu-byte event object ran out",
                            sizeof *event);
    }
    event->magic = EVENT_MAGIC;
    event->device = device;
    *out_event = event;
    return NULL;
}

PolychipError *cobalt_event_destroy(PolychipEvent *event) {
    PolychipError *error = check_event(event, "event_destroy");
    if (error != NULL) {
        return error;
    }
    event->magic = DEAD_MAGIC;
    free(event);
    return NULL;
}

PolychipError *cobalt_event_record(PolychipEvent *event, PolychipStream *stream) {
    PolychipError *error = check_event(event, "event_record");
    if (error != NULL) {
        return error;
    }
    if (stream != NULL) {
        error = check_stream_handle(stream, "event_record");
        if (error == NULL && stream->device != event->device) {
            error = cobalt_error(POLYCHIP_ERROR_INVALID_ARGUMENT,
                                 "cobalt: event_record: the event belongs to device %u but the "
                                 "stream to device %u",
                                 (unsigned)event->device, (unsigned)stream->device);
        }
    }
    /* Work before this point has completed already: the event is complete. */
    return error;
}

/* NULL stream: the default stream (of the event's device); nothing to wait for. */
PolychipError *cobalt_stream_wait_event(PolychipStream *stream, PolychipEvent *event) {
    PolychipError *error = check_event(event, "stream_wait_event");
    if (error != NULL) {
        return error;
    }
    if (stream != NULL) {
        return check_stream_handle(stream, "stream_wait_event");
    }
    return NULL;
}

PolychipError *cobalt_event_synchronize(PolychipEvent *event) {
    return check_event(event, "event_synchronize");
}
