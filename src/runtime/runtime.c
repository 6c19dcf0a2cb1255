/*
 * runtime.c - a runtime's life: creation, destruction, the default runtime,
 * fork; and what belongs to no one device: recorded errors, the log sink,
 * the only-CPU-device hint.  Channels are in channels.c, targets in
 * registry.c, calls in calls.c; runtime.h describes the whole and its locks.
 */
#include <stdio.h>
#include <string.h>

#include "runtime/queue.h"
#include "runtime/runtime.h"

/* ---- errors and the log ---------------------------------------------- */

void
hcb_runtime_record_error(hcb_runtime *rt, hcb_device device,
                         const hcb_error *error)
{
    channel *ch = hcb__channel_find(rt, device);

    if (ch != NULL)
        atomic_fetch_add_explicit(&ch->errors, 1, memory_order_relaxed);
    hcb__mutex_lock(&rt->err_mu);
    rt->pending_errors++;
    rt->last_error = *error;
    hcb__mutex_unlock(&rt->err_mu);
}

uint64_t
hcb_runtime_take_error(hcb_runtime *rt, hcb_error *last)
{
    uint64_t n;

    hcb__mutex_lock(&rt->err_mu);
    n = rt->pending_errors;
    if (n > 0 && last != NULL)
        *last = rt->last_error;
    rt->pending_errors = 0;
    hcb__mutex_unlock(&rt->err_mu);
    return n;
}

void
hcb_runtime_set_log(hcb_runtime *rt, hcb_log_fn fn, void *user)
{
    hcb__mutex_lock(&rt->mu);
    rt->log_fn = fn;
    rt->log_user = user;
    hcb__mutex_unlock(&rt->mu);
}

void
hcb__runtime_wait_begin(hcb_runtime *rt, hcb_device device, hcb__wait *w)
{
    hcb__check check;

    hcb__mutex_lock(&rt->mu);
    check = rt->interrupt;
    hcb__mutex_unlock(&rt->mu);
    hcb__wait_begin(w, &check, device);
}

void
hcb__runtime_log(hcb_runtime *rt, const char *fmt, ...)
{
    char msg[HCB_ERROR_MESSAGE_SIZE];
    hcb_log_fn fn;
    void *user;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    hcb__mutex_lock(&rt->mu);
    fn = rt->log_fn;
    user = rt->log_user;
    hcb__mutex_unlock(&rt->mu);
    if (fn != NULL)
        fn(user, msg);
    else
        fprintf(stderr, "hcb: warning: %s\n", msg);
}

/* ---- the warning thread --------------------------------------------------
 *
 * Logs the warnings of threads that must not run the sink themselves (a
 * device's thread waiting for room: runtime.h, "Stalls").  It starts at
 * the first such warning and exits once stopped and out of messages. */

/* Logs the oldest waiting message; called with warn_mu held and a message
 * waiting, returns with it held (released while the sink runs). */
static void
log_next_warning(hcb_runtime *rt)
{
    char msg[HCB_ERROR_MESSAGE_SIZE];
    uint64_t dropped;

    memcpy(msg, rt->warn_msgs[rt->warn_head], sizeof msg);
    rt->warn_head = (rt->warn_head + 1) % WARN_SLOTS;
    rt->warn_count--;
    dropped = rt->warn_dropped;
    rt->warn_dropped = 0;
    hcb__mutex_unlock(&rt->warn_mu);
    if (dropped > 0)
        hcb__runtime_log(rt, "%s (and %llu warnings more, dropped)", msg,
                         (unsigned long long)dropped);
    else
        hcb__runtime_log(rt, "%s", msg);
    hcb__mutex_lock(&rt->warn_mu);
}

static void *
warn_main(void *arg)
{
    hcb_runtime *rt = arg;

    hcb__mutex_lock(&rt->warn_mu);
    for (;;) {
        while (rt->warn_count == 0 && !rt->warn_stopping)
            hcb__cond_wait(&rt->warn_cv, &rt->warn_mu);
        if (rt->warn_count == 0)
            break; /* stopped, and nothing left */
        log_next_warning(rt);
    }
    hcb__mutex_unlock(&rt->warn_mu);
    return NULL;
}

void
hcb__runtime_warn(hcb_runtime *rt, const char *fmt, ...)
{
    char msg[HCB_ERROR_MESSAGE_SIZE];
    bool to_stderr = false;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    hcb__mutex_lock(&rt->warn_mu);
    if (rt->warn_count == WARN_SLOTS) {
        rt->warn_dropped++;
    } else {
        memcpy(rt->warn_msgs[(rt->warn_head + rt->warn_count) % WARN_SLOTS],
               msg, sizeof msg);
        rt->warn_count++;
        if (rt->warn_running) {
            hcb__cond_broadcast(&rt->warn_cv); /* stops wait on it too */
        } else if (hcb__thread_create(&rt->warn_thread, "hcb-warn", warn_main,
                                      rt) == HCB_OK) {
            rt->warn_running = true;
        } else { /* no thread: the message must not be lost with it */
            rt->warn_count--;
            to_stderr = true;
        }
    }
    hcb__mutex_unlock(&rt->warn_mu);
    if (to_stderr)
        fprintf(stderr, "hcb: warning: %s\n", msg);
}

void
hcb__runtime_warn_stop(hcb_runtime *rt)
{
    pthread_t t;

    hcb__mutex_lock(&rt->warn_mu);
    while (rt->warn_joining) /* another stop joins it: wait for that one */
        hcb__cond_wait(&rt->warn_cv, &rt->warn_mu);
    if (!rt->warn_running || pthread_equal(rt->warn_thread, pthread_self())) {
        hcb__mutex_unlock(&rt->warn_mu);
        return; /* none, or the sink itself stops the runtime */
    }
    rt->warn_joining = rt->warn_stopping = true;
    t = rt->warn_thread;
    hcb__cond_broadcast(&rt->warn_cv);
    hcb__mutex_unlock(&rt->warn_mu);
    hcb__thread_join(t);
    hcb__mutex_lock(&rt->warn_mu);
    rt->warn_running = rt->warn_joining = rt->warn_stopping = false;
    hcb__cond_broadcast(&rt->warn_cv);
    /* A warning that came after the thread's last look found it running
     * and started none: logged here, or it would wait for the next one. */
    while (rt->warn_count > 0)
        log_next_warning(rt);
    hcb__mutex_unlock(&rt->warn_mu);
}

void
hcb_runtime_set_only_cpu_device(hcb_runtime *rt, int32_t ordinal)
{
    atomic_store_explicit(&rt->only_cpu_ordinal, ordinal < 0 ? -1 : ordinal,
                          memory_order_relaxed);
}

/* ---- fork --------------------------------------------------------------- */

/* Every live runtime, for the fork handler.  A plain mutex: the prepare
 * handler holds it across fork, so the child's only thread owns it. */
static pthread_mutex_t runtimes_mu = PTHREAD_MUTEX_INITIALIZER;
static hcb_runtime *runtimes;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void
reset_channel_after_fork(channel *ch)
{
    (void)hcb__mutex_init(&ch->lifecycle);
    atomic_store(&ch->running, false);
    atomic_store(&ch->errors, 0);
    atomic_store(&ch->delivering, NULL);
    atomic_store(&ch->stall_warned_ns, 0);
    hcb__queue_reset_after_fork(&ch->queue);
}

static void
reset_after_fork(hcb_runtime *rt)
{
    size_t i;

    (void)hcb__mutex_init(&rt->mu);
    (void)hcb__mutex_init(&rt->err_mu);
    (void)hcb__mutex_init(&rt->warn_mu);
    (void)hcb__cond_init(&rt->warn_cv);
    rt->warn_running = rt->warn_stopping = rt->warn_joining = false;
    rt->warn_head = rt->warn_count = 0;
    rt->warn_dropped = 0;
    rt->pending_errors = 0;
    memset(rt->sharded, 0, sizeof rt->sharded);
    hcb__meetings_reset_after_fork(rt);
    for (i = 0; i < CHANNEL_SLOTS; i++) {
        channel *ch = atomic_load_explicit(&rt->slots[i], memory_order_relaxed);

        if (ch != NULL)
            reset_channel_after_fork(ch);
    }
}

static void
atfork_prepare(void)
{
    pthread_mutex_lock(&runtimes_mu);
}

static void
atfork_parent(void)
{
    pthread_mutex_unlock(&runtimes_mu);
}

static void
atfork_child(void)
{
    hcb_runtime *rt;

    hcb__consumer = NULL;
    for (rt = runtimes; rt != NULL; rt = rt->next_runtime)
        reset_after_fork(rt);
    pthread_mutex_unlock(&runtimes_mu);
}

static void
install_atfork(void)
{
    /* failure (ENOMEM) leaves fork children without a runtime reset, as
     * before: nothing to report it to.  The record pools' handlers first:
     * prepare handlers run in the reverse order, so runtimes_mu is taken
     * before the pools' locks, and released after them. */
    (void)pthread_atfork(hcb__record_fork_prepare, hcb__record_fork_parent,
                         hcb__record_fork_child);
    (void)pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static void
runtimes_add(hcb_runtime *rt)
{
    pthread_once(&atfork_once, install_atfork);
    pthread_mutex_lock(&runtimes_mu);
    rt->next_runtime = runtimes;
    runtimes = rt;
    pthread_mutex_unlock(&runtimes_mu);
}

static void
runtimes_remove(hcb_runtime *rt)
{
    hcb_runtime **p;

    pthread_mutex_lock(&runtimes_mu);
    for (p = &runtimes; *p != NULL; p = &(*p)->next_runtime)
        if (*p == rt) {
            *p = rt->next_runtime;
            break;
        }
    pthread_mutex_unlock(&runtimes_mu);
}

/* ---- creation and destruction ------------------------------------------- */

int
hcb_runtime_create(const hcb_runtime_options *options, hcb_runtime **out,
                   hcb_error *err)
{
    hcb_runtime_options opts = HCB_RUNTIME_OPTIONS_INIT;
    hcb_runtime *rt;
    size_t i;

    *out = NULL;
    if (options != NULL) {
        if (options->struct_size < sizeof opts)
            return hcb_error_set(err, HCB_EINVAL,
                                 "runtime options have struct_size %zu, "
                                 "expected at least %zu",
                                 options->struct_size, sizeof opts);
        opts = *options;
    }
    if (opts.max_queue_bytes == 0)
        return hcb_error_set(err, HCB_EINVAL,
                             "max_queue_bytes must be positive, got 0");
    rt = hcb__calloc(1, sizeof *rt);
    if (rt == NULL)
        return hcb_error_set(err, HCB_ENOMEM, "cannot allocate a runtime");
    rt->max_queue_bytes = opts.max_queue_bytes;
    for (i = 0; i < CHANNEL_SLOTS; i++)
        atomic_init(&rt->slots[i], NULL);
    for (i = 0; i < TARGET_CHUNKS; i++)
        atomic_init(&rt->chunks[i], NULL);
    atomic_init(&rt->ntargets, 0);
    atomic_init(&rt->only_cpu_ordinal, -1);
    if (hcb__mutex_init(&rt->mu) != HCB_OK) {
        hcb__free(rt);
        return hcb_error_set(err, HCB_ESYSTEM, "cannot create a mutex");
    }
    if (hcb__mutex_init(&rt->err_mu) != HCB_OK) {
        hcb__mutex_destroy(&rt->mu);
        hcb__free(rt);
        return hcb_error_set(err, HCB_ESYSTEM, "cannot create a mutex");
    }
    if (hcb__mutex_init(&rt->warn_mu) != HCB_OK ||
        hcb__cond_init(&rt->warn_cv) != HCB_OK) {
        hcb__mutex_destroy(&rt->err_mu);
        hcb__mutex_destroy(&rt->mu);
        hcb__free(rt);
        return hcb_error_set(err, HCB_ESYSTEM, "cannot create a mutex");
    }
    if (hcb__meetings_init(rt) != HCB_OK) {
        hcb__cond_destroy(&rt->warn_cv);
        hcb__mutex_destroy(&rt->warn_mu);
        hcb__mutex_destroy(&rt->err_mu);
        hcb__mutex_destroy(&rt->mu);
        hcb__free(rt);
        return hcb_error_set(err, HCB_ESYSTEM, "cannot create a mutex");
    }
    runtimes_add(rt);
    *out = rt;
    return HCB_OK;
}

void
hcb_runtime_destroy(hcb_runtime *rt)
{
    size_t i;

    if (rt == NULL)
        return;
    runtimes_remove(rt);
    hcb_runtime_stop(rt, NULL);
    for (i = 0; i < CHANNEL_SLOTS; i++) {
        channel *ch = atomic_load_explicit(&rt->slots[i], memory_order_relaxed);

        if (ch != NULL)
            hcb__channel_free(ch);
    }
    for (i = 0; i < TARGET_CHUNKS; i++)
        hcb__free(atomic_load_explicit(&rt->chunks[i], memory_order_relaxed));
    hcb__meetings_destroy(rt);
    hcb__cond_destroy(&rt->warn_cv);
    hcb__mutex_destroy(&rt->warn_mu);
    hcb__mutex_destroy(&rt->err_mu);
    hcb__mutex_destroy(&rt->mu);
    hcb__free(rt);
}

/* The default runtime is the one piece of process state the FFI handlers
 * need: XLA calls them with no context of ours. */
static hcb_runtime *default_runtime;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;
/* default_runtime once created: every tap reads it, one load instead of a
 * pthread_once call. */
static _Atomic(hcb_runtime *) default_ready;

static void
create_default(void)
{
    if (hcb_runtime_create(NULL, &default_runtime, NULL) != HCB_OK)
        default_runtime = NULL;
    atomic_store_explicit(&default_ready, default_runtime,
                          memory_order_release);
}

hcb_runtime *
hcb_runtime_default(void)
{
    hcb_runtime *rt =
        atomic_load_explicit(&default_ready, memory_order_acquire);

    if (rt != NULL)
        return rt;
    pthread_once(&default_once, create_default);
    return default_runtime;
}
