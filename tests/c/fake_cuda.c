/* fake_cuda.c - the stand-in CUDA runtime (fake_cuda.h). */
#define _POSIX_C_SOURCE 200809L

#include "fake_cuda.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { OP_COPY, OP_SET, OP_WAIT };

typedef struct op {
    struct op *next;
    int kind;
    void *dst;
    const void *src;
    size_t n;
    int value;
    fake_stream *after; /* OP_WAIT: waits until `after` has run `upto` ops */
    unsigned long upto;
} op;

struct fake_stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    op *head, *tail;
    bool held, running_op, stop;
    unsigned long enqueued, completed; /* ops, ever */
    int device;
    pthread_t thread;
};

/* An event: the point of a stream where it was recorded. */
typedef struct fake_event {
    int device; /* the thread's current device when it was made */
    fake_stream *stream;
    unsigned long upto;
} fake_event;

/* The thread's current device (cudaSetDevice). */
static _Thread_local int current_device;

fake_counts fake_cuda_counts;
atomic_long fake_cuda_fail_copy_after = -1, fake_cuda_fail_record_after = -1;
atomic_bool fake_cuda_refuse_host_alloc;

#define LAUNCH_FAILURE  719 /* cudaErrorLaunchFailure */
#define NOT_READY       600 /* cudaErrorNotReady */
#define INVALID_DEVICE  101 /* cudaErrorInvalidDevice */
#define INVALID_HANDLE  400 /* cudaErrorInvalidResourceHandle */
#define ALLOCATION_FAIL 2   /* cudaErrorMemoryAllocation */
#define FAKE_DEVICES    16

static void *
stream_main(void *arg)
{
    fake_stream *s = arg;
    op *o;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && (s->held || s->head == NULL))
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->head == NULL) /* stopped, and nothing left */
            break;
        o = s->head;
        s->head = o->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->running_op = true;
        pthread_mutex_unlock(&s->mu);
        switch (o->kind) {
        case OP_COPY:
            memcpy(o->dst, o->src, o->n);
            break;
        case OP_SET:
            memset(o->dst, o->value, o->n);
            break;
        case OP_WAIT:
            pthread_mutex_lock(&o->after->mu);
            while (o->after->completed < o->upto)
                pthread_cond_wait(&o->after->cv, &o->after->mu);
            pthread_mutex_unlock(&o->after->mu);
            break;
        }
        free(o);
        pthread_mutex_lock(&s->mu);
        s->running_op = false;
        s->completed++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

fake_stream *
fake_stream_new(void)
{
    return fake_stream_new_on(0);
}

fake_stream *
fake_stream_new_on(int device)
{
    fake_stream *s = calloc(1, sizeof *s);

    s->device = device;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_create(&s->thread, NULL, stream_main, s);
    return s;
}

void
fake_stream_free(fake_stream *s)
{
    pthread_mutex_lock(&s->mu);
    s->held = false;
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void
fake_stream_hold(fake_stream *s, bool hold)
{
    pthread_mutex_lock(&s->mu);
    s->held = hold;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void
fake_stream_drain(fake_stream *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->head != NULL || s->running_op)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

bool
fake_stream_idle_within(fake_stream *s, long ms)
{
    struct timespec until;
    bool idle;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    while ((s->head != NULL || s->running_op) &&
           pthread_cond_timedwait(&s->cv, &s->mu, &until) == 0)
        ;
    idle = s->head == NULL && !s->running_op;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

static int
enqueue(void *stream, op o)
{
    fake_stream *s = stream;
    op *copy = malloc(sizeof *copy);

    *copy = o;
    copy->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail != NULL)
        s->tail->next = copy;
    else
        s->head = copy;
    s->tail = copy;
    s->enqueued++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static bool
fails(atomic_long *countdown)
{
    long k = atomic_fetch_sub(countdown, 1);

    if (k < 0)
        atomic_store(countdown, -1);
    return k == 0;
}

static int
fake_memcpy_async(void *dst, const void *src, size_t n, int kind, void *stream)
{
    op o = {NULL, OP_COPY, dst, src, n, 0, NULL, 0};

    (void)kind;
    if (fails(&fake_cuda_fail_copy_after))
        return LAUNCH_FAILURE;
    atomic_fetch_add(&fake_cuda_counts.copies, 1);
    return enqueue(stream, o);
}

static int
fake_memset_async(void *dst, int value, size_t n, void *stream)
{
    op o = {NULL, OP_SET, dst, NULL, n, value, NULL, 0};

    atomic_fetch_add(&fake_cuda_counts.memsets, 1);
    return enqueue(stream, o);
}

static int
fake_stream_synchronize(void *stream)
{
    atomic_fetch_add(&fake_cuda_counts.syncs, 1);
    fake_stream_drain(stream);
    return 0;
}

static int
fake_host_alloc(void **ptr, size_t n, unsigned flags)
{
    (void)flags;
    atomic_fetch_add(&fake_cuda_counts.host_allocs, 1);
    if (atomic_load(&fake_cuda_refuse_host_alloc))
        return ALLOCATION_FAIL;
    *ptr = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
    return *ptr != NULL ? 0 : ALLOCATION_FAIL;
}

static int
fake_free_host(void *ptr)
{
    atomic_fetch_add(&fake_cuda_counts.free_hosts, 1);
    free(ptr);
    return 0;
}

static const char *
fake_error_string(int status)
{
    switch (status) {
    case LAUNCH_FAILURE:
        return "unspecified launch failure";
    case INVALID_HANDLE:
        return "invalid resource handle";
    case ALLOCATION_FAIL:
        return "out of memory";
    default:
        return "fake CUDA error";
    }
}

static int
fake_event_create(void **event, unsigned flags)
{
    fake_event *e = calloc(1, sizeof *e);

    (void)flags;
    atomic_fetch_add(&fake_cuda_counts.events, 1);
    if (e == NULL)
        return ALLOCATION_FAIL;
    e->device = current_device;
    *event = e;
    return 0;
}

static int
fake_event_record(void *event, void *stream)
{
    fake_event *e = event;
    fake_stream *s = stream;

    if (fails(&fake_cuda_fail_record_after))
        return LAUNCH_FAILURE;
    atomic_fetch_add(&fake_cuda_counts.event_records, 1);
    if (e->device != s->device)
        return INVALID_HANDLE; /* CUDA: not the stream's device */
    pthread_mutex_lock(&s->mu);
    e->stream = s;
    e->upto = s->enqueued;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int
fake_stream_wait_event(void *stream, void *event, unsigned flags)
{
    fake_event *e = event;
    op o = {NULL, OP_WAIT, NULL, NULL, 0, 0, e->stream, e->upto};

    (void)flags;
    atomic_fetch_add(&fake_cuda_counts.event_waits, 1);
    return enqueue(stream, o);
}

static int
fake_event_synchronize(void *event)
{
    fake_event *e = event;
    fake_stream *s = e->stream;

    if (s == NULL)
        return 0; /* never recorded: CUDA says it is done */
    pthread_mutex_lock(&s->mu);
    while (s->completed < e->upto)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int
fake_event_query(void *event)
{
    fake_event *e = event;
    fake_stream *s = e->stream;
    bool done;

    if (s == NULL)
        return 0;
    pthread_mutex_lock(&s->mu);
    done = s->completed >= e->upto;
    pthread_mutex_unlock(&s->mu);
    return done ? 0 : NOT_READY;
}

static int
fake_event_destroy(void *event)
{
    free(event);
    return 0;
}

static int
fake_get_device(int *device)
{
    *device = current_device;
    return 0;
}

static int
fake_set_device(int device)
{
    if (device < 0 || device >= FAKE_DEVICES)
        return INVALID_DEVICE;
    atomic_fetch_add(&fake_cuda_counts.set_devices, 1);
    current_device = device;
    return 0;
}

const hcb__cuda fake_cuda = {
    .memcpy_async = fake_memcpy_async,
    .memset_async = fake_memset_async,
    .stream_synchronize = fake_stream_synchronize,
    .host_alloc = fake_host_alloc,
    .free_host = fake_free_host,
    .error_string = fake_error_string,
    .event_create = fake_event_create,
    .event_record = fake_event_record,
    .stream_wait_event = fake_stream_wait_event,
    .event_destroy = fake_event_destroy,
    .event_synchronize = fake_event_synchronize,
    .event_query = fake_event_query,
    .get_device = fake_get_device,
    .set_device = fake_set_device,
};

void
fake_cuda_reset_counts(void)
{
    atomic_store(&fake_cuda_counts.copies, 0);
    atomic_store(&fake_cuda_counts.event_records, 0);
    atomic_store(&fake_cuda_counts.memsets, 0);
    atomic_store(&fake_cuda_counts.syncs, 0);
    atomic_store(&fake_cuda_counts.host_allocs, 0);
    atomic_store(&fake_cuda_counts.free_hosts, 0);
    atomic_store(&fake_cuda_counts.events, 0);
    atomic_store(&fake_cuda_counts.event_waits, 0);
    atomic_store(&fake_cuda_counts.set_devices, 0);
    atomic_store(&fake_cuda_refuse_host_alloc, false);
    atomic_store(&fake_cuda_fail_copy_after, -1);
    atomic_store(&fake_cuda_fail_record_after, -1);
}
