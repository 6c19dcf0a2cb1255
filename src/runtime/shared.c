/*
 * shared.c - calls that the devices of one computation make together:
 * under jit over operands sharded across devices, every device runs the
 * custom call on the whole operands, one of them runs the function for the
 * runner (the device the call names), and the others take a copy of its
 * results -- one run of the function per call, as JAX runs a callback
 * there, with no XLA collective to spread what it returns
 * (hcb_runtime_call_shared, hcb_runtime_deliver_shared).
 *
 * DESIGN
 *
 * Meetings.  A call site's shared calls in one launch (XLA's run id, the
 * same on every device of an SPMD execution) form a meeting slot, its
 * meetings numbered 0, 1, ...: the k-th time a device reaches the call in
 * that launch it goes to meeting k (every device of an SPMD program makes
 * the same calls, in the same order; each device's count is its seat's
 * `next`).  Three counters order them: `claimed` (meetings whose runner is
 * known), `published` (meetings whose outcome the runner has written) and
 * `closed` (meetings every other participant has taken).  The runner of
 * meeting k waits until closed == k, runs the function into its own
 * result buffers, copies their bytes (or its error) into the slot and sets
 * published = k + 1.  Each other participant waits until published > k,
 * copies the bytes into its result buffers (or takes the error) and counts
 * itself in `taken`; the last one sets taken back to 0 and closed = k + 1.
 * The outcome is the runner's from closed == k to its publication, and the
 * others' from then until closed == k + 1: never written while read.  The
 * counters are sequentially consistent atomics: no lock is held to claim,
 * publish, take or close.
 *
 * Who runs.  The share's runner, or, with `first_runs` (every participant
 * holds the whole operands: the CPU), the first participant to reach
 * meeting k, which moves `claimed` from k to k + 1 and runs the function
 * as the runner (the device it is given, whose earlier taps go first, and
 * whose errors it records, is the runner).  The devices of a step reach a
 * call one after the other -- measured on 2 cores with 4 devices, 22 us
 * from the first to the last after a collective, the runner 8 us after
 * the first, then 4 us of function -- so the first to come has the
 * outcome ready when the last comes, and no device waits for one that has
 * not been scheduled yet.  A participant finds claimed >= k when it comes
 * (it took meeting k - 1, which was claimed), so one CAS decides.
 *
 * Waiting.  The runner's function takes a few microseconds and the devices
 * of a step arrive together: a waiter polls its counter for a moment
 * first, yielding the processor at each look (on a machine with fewer
 * cores than devices the thread it waits for needs one: measured, polling
 * with pauses between yields made a step of a sharded scan slower), and
 * only then sleeps on rt->meet_cv, counted in `sleepers`; whoever moves a
 * counter broadcasts, under meet_mu, only when someone sleeps.  The
 * sleeper counts itself and then reads the counter, the mover writes the
 * counter and then reads `sleepers`: one of them sees the other, so none
 * sleeps through its meeting.
 *
 * Slots.  A slot is taken at the first call of its (call site, launch,
 * runner) and kept: nothing says when a launch has ended.  When all are
 * taken, the one least recently used that is quiet (no call inside it,
 * every meeting published closed) is reused.  Reusing a quiet slot of a
 * launch still under way is safe: every device of it left its seat, so
 * all of them start the next meeting of that call site afresh, in a new
 * slot, together.  Few launches are under way at once (a program that
 * shares calls is dispatched paced: python/host_callback/_pacing.py), so
 * few slots are not quiet.  None free, none quiet: HCB_ESTATE.
 *
 * Threads and locks.  The devices' threads are XLA's, one per device for
 * a multi-device launch.  rt->meet_mu guards the slots' keys and seats and
 * the sleeping (a leaf: no other lock is taken under it, and it is taken
 * under none).  No lock is held while a function runs or bytes are
 * copied.  A participant that has waited HCB_CALL_WAIT_WARN_NS says so,
 * once per call, from the warning thread.
 */
#include <sched.h>
#include <stddef.h>
#include <string.h>

#include "runtime/runtime.h"

/* A slot's published bytes up to this size stay allocated between its
 * meetings; larger ones are freed when the next meeting needs less. */
#define KEPT_BYTES 4096
/* How long a waiter polls before it sleeps, in yields of the processor
 * (about a millisecond when others want it, less when none does). */
#define MEET_SPINS 2048

/* Frees what `m` holds and makes it a free slot. */
static void
slot_free(meeting *m)
{
    hcb__free(m->bytes);
    hcb__free(m->seats);
    m->id = 0;
    m->launch = 0;
    m->runner = 0;
    m->participants = 0;
    m->used = 0;
    m->seats = NULL;
    m->nseats = 0;
    atomic_store(&m->inside, 0);
    atomic_store(&m->claimed, 0);
    atomic_store(&m->published, 0);
    atomic_store(&m->closed, 0);
    atomic_store(&m->taken, 0);
    atomic_store(&m->sleepers, 0);
    m->rc = HCB_OK;
    m->bytes = NULL;
    m->nbytes = m->cap = 0;
}

int
hcb__meetings_init(hcb_runtime *rt)
{
    size_t i;

    if (hcb__mutex_init(&rt->meet_mu) != HCB_OK)
        return HCB_ESYSTEM;
    if (hcb__cond_init(&rt->meet_cv) != HCB_OK) {
        hcb__mutex_destroy(&rt->meet_mu);
        return HCB_ESYSTEM;
    }
    rt->meet_clock = 0;
    memset(rt->meetings, 0, sizeof rt->meetings);
    for (i = 0; i < MEETING_SLOTS; i++)
        slot_free(&rt->meetings[i]); /* the atomics initialised */
    return HCB_OK;
}

void
hcb__meetings_destroy(hcb_runtime *rt)
{
    size_t i;

    for (i = 0; i < MEETING_SLOTS; i++)
        slot_free(&rt->meetings[i]);
    hcb__cond_destroy(&rt->meet_cv);
    hcb__mutex_destroy(&rt->meet_mu);
}

void
hcb__meetings_reset_after_fork(hcb_runtime *rt)
{
    size_t i;

    /* the parent's threads were inside them: the child starts afresh (what
     * they hold is left, as the parent's records are) */
    for (i = 0; i < MEETING_SLOTS; i++) {
        rt->meetings[i].bytes = NULL;
        rt->meetings[i].seats = NULL;
        slot_free(&rt->meetings[i]);
    }
    (void)hcb__mutex_init(&rt->meet_mu);
    (void)hcb__cond_init(&rt->meet_cv);
}

/* The slot of (id, share), taken now if it has none.  Under meet_mu. */
static meeting *
slot_of(hcb_runtime *rt, uint64_t id, const hcb_share *share, hcb_error *err)
{
    meeting *m, *oldest = NULL;
    size_t i;

    for (i = 0; i < MEETING_SLOTS; i++) {
        m = &rt->meetings[i];
        if (m->id == id && m->launch == share->launch &&
            m->runner == share->runner &&
            m->participants == share->participants)
            return m;
    }
    for (i = 0; i < MEETING_SLOTS; i++) {
        m = &rt->meetings[i];
        if (m->id == 0) {
            oldest = m;
            break;
        }
        /* quiet: nobody inside, and every meeting published closed */
        if (atomic_load(&m->inside) == 0 &&
            atomic_load(&m->published) == atomic_load(&m->closed) &&
            (oldest == NULL || m->used < oldest->used))
            oldest = m;
    }
    if (oldest == NULL) {
        hcb_error_set(err, HCB_ESTATE,
                      "shared call %llu: all %d meeting slots are in use",
                      (unsigned long long)id, MEETING_SLOTS);
        return NULL;
    }
    slot_free(oldest);
    oldest->seats =
        hcb__calloc((size_t)share->participants, sizeof *oldest->seats);
    if (oldest->seats == NULL) {
        hcb_error_set(err, HCB_ENOMEM, "cannot allocate %lld meeting seats",
                      (long long)share->participants);
        return NULL;
    }
    oldest->id = id;
    oldest->launch = share->launch;
    oldest->runner = share->runner;
    oldest->participants = share->participants;
    return oldest;
}

/* The meeting `device` goes to now in `m`, its seat taken at its first
 * call.  Under meet_mu. */
static int
ticket(meeting *m, hcb_device device, uint64_t *k, hcb_error *err)
{
    int64_t i;

    for (i = 0; i < m->nseats && m->seats[i].device != device; i++)
        ;
    if (i == m->nseats) {
        if (m->nseats == m->participants)
            return hcb_error_set(
                err, HCB_EINVAL,
                "shared call %llu: device %s:%d is one more "
                "than its %lld participants",
                (unsigned long long)m->id, hcb__platform_name(device),
                (int)HCB_DEVICE_ORDINAL(device), (long long)m->participants);
        m->seats[m->nseats].device = device;
        m->seats[m->nseats].next = 0;
        m->nseats++;
    }
    *k = m->seats[i].next++;
    return HCB_OK;
}

/* What a waiter of meeting k waits for: the runner, the previous
 * meeting closed; the others, meeting k published. */
static bool
may_run(meeting *m, uint64_t k)
{
    return atomic_load(&m->closed) == k;
}

static bool
is_published(meeting *m, uint64_t k)
{
    return atomic_load(&m->published) > k;
}

/* Waits until `ready(m, k)` (see "Waiting"); once it has waited
 * HCB_CALL_WAIT_WARN_NS, says so from the warning thread (`device` waits
 * for `what`). */
static void
await(hcb_runtime *rt, meeting *m, uint64_t k,
      bool (*ready)(meeting *, uint64_t), hcb_device device, const char *what)
{
    uint64_t warn_at;
    int spin;

    for (spin = 0; spin < MEET_SPINS; spin++) {
        if (ready(m, k))
            return;
        sched_yield();
    }
    warn_at = hcb__now_ns() + HCB_CALL_WAIT_WARN_NS;
    hcb__mutex_lock(&rt->meet_mu);
    atomic_fetch_add(&m->sleepers, 1);
    while (!ready(m, k)) {
        if (hcb__cond_wait_until(&rt->meet_cv, &rt->meet_mu, warn_at) ||
            hcb__now_ns() < warn_at)
            continue;
        /* meet_mu is a leaf: not held while the warning is handed over
         * (still counted a sleeper: a wake-up meanwhile is seen by the
         * loop's check) */
        hcb__mutex_unlock(&rt->meet_mu);
        hcb__runtime_warn(
            rt,
            "device %s:%d has waited %.1f s %s of shared call %llu (device "
            "%s:%d runs its function).  It goes on waiting",
            hcb__platform_name(device), (int)HCB_DEVICE_ORDINAL(device),
            (double)HCB_CALL_WAIT_WARN_NS / 1e9, what,
            (unsigned long long)m->id, hcb__platform_name(m->runner),
            (int)HCB_DEVICE_ORDINAL(m->runner));
        warn_at = UINT64_MAX;
        hcb__mutex_lock(&rt->meet_mu);
    }
    atomic_fetch_sub(&m->sleepers, 1);
    hcb__mutex_unlock(&rt->meet_mu);
}

/* After a counter of `m` moved: wakes whoever sleeps on it. */
static void
wake(hcb_runtime *rt, meeting *m)
{
    if (atomic_load(&m->sleepers) == 0)
        return;
    hcb__mutex_lock(&rt->meet_mu);
    hcb__cond_broadcast(&rt->meet_cv);
    hcb__mutex_unlock(&rt->meet_mu);
}

/* The bytes of `n` arrays. */
static size_t
total_bytes(const hcb_array *a, size_t n)
{
    size_t i, bytes = 0;

    for (i = 0; i < n; i++)
        bytes += a[i].nbytes;
    return bytes;
}

/* Whether the first participant to come runs the function (a share as
 * old as the field's absence: the runner does). */
static bool
first_runs(const hcb_share *share)
{
    return share->struct_size >=
               offsetof(hcb_share, first_runs) + sizeof share->first_runs &&
           share->first_runs != 0;
}

/* Whether `device`, come to meeting k of `m`, runs it (see "Who runs"). */
static bool
runs(meeting *m, const hcb_share *share, hcb_device device, uint64_t k)
{
    uint64_t unclaimed = k;

    if (first_runs(share))
        return atomic_compare_exchange_strong(&m->claimed, &unclaimed, k + 1);
    if (device != share->runner)
        return false;
    atomic_store(&m->claimed, k + 1); /* kept in step all the same */
    return true;
}

/* One device's part of a shared call (see DESIGN): the one that runs it
 * (see "Who runs") runs `work` and publishes its outcome and the bytes of
 * `results`; the others copy them into theirs. */
static int
meet(hcb_runtime *rt, const hcb_share *share, uint64_t id, hcb_device device,
     hcb__share_work work, void *work_ctx, const hcb_array *results,
     size_t nresults, hcb_error *err)
{
    size_t need = total_bytes(results, nresults), off, i;
    meeting *m;
    uint64_t k = 0;
    int rc;

    hcb__mutex_lock(&rt->meet_mu);
    if ((m = slot_of(rt, id, share, err)) == NULL ||
        (rc = ticket(m, device, &k, err)) != HCB_OK) {
        hcb__mutex_unlock(&rt->meet_mu);
        return err->code;
    }
    atomic_fetch_add(&m->inside, 1);
    m->used = ++rt->meet_clock;
    hcb__mutex_unlock(&rt->meet_mu);
    if (runs(m, share, device, k)) {
        await(rt, m, k, may_run, device,
              "for the others to take its last outcome");
        rc = work(work_ctx, err);
        if (rc == HCB_OK && (need > m->cap || m->cap > KEPT_BYTES)) {
            unsigned char *bytes = need > 0 ? hcb__malloc(need) : NULL;

            if (bytes == NULL && need > 0) {
                rc = hcb_error_set(err, HCB_ENOMEM,
                                   "shared call %llu: cannot allocate %zu "
                                   "bytes for its results",
                                   (unsigned long long)id, need);
            } else {
                hcb__free(m->bytes);
                m->bytes = bytes;
                m->cap = need;
            }
        }
        for (i = 0, off = 0; rc == HCB_OK && i < nresults; i++) {
            if (results[i].nbytes > 0)
                memcpy(m->bytes + off, results[i].data, results[i].nbytes);
            off += results[i].nbytes;
        }
        m->rc = rc;
        if (rc != HCB_OK)
            m->err = *err;
        m->nbytes = need;
        atomic_store(&m->published, k + 1);
    } else {
        await(rt, m, k, is_published, device, "for the outcome");
        rc = m->rc;
        if (rc != HCB_OK)
            *err = m->err;
        else if (m->nbytes != need)
            rc = hcb_error_set(err, HCB_EINVAL,
                               "shared call %llu: %zu bytes of results on "
                               "%s:%d, %zu on its runner",
                               (unsigned long long)id, need,
                               hcb__platform_name(device),
                               (int)HCB_DEVICE_ORDINAL(device), m->nbytes);
        for (i = 0, off = 0; rc == HCB_OK && i < nresults; i++) {
            if (results[i].nbytes > 0)
                memcpy(results[i].data, m->bytes + off, results[i].nbytes);
            off += results[i].nbytes;
        }
        if (atomic_fetch_add(&m->taken, 1) + 1 == m->participants - 1) {
            atomic_store(&m->taken, 0); /* the last: close it */
            atomic_store(&m->closed, k + 1);
        }
    }
    atomic_fetch_sub(&m->inside, 1);
    wake(rt, m);
    return rc;
}

/* The start of a shared call or delivery: `err` cleared, the share
 * checked. */
static int
check_share(const hcb_share *share, hcb_device device, hcb_error *err)
{
    err->code = HCB_OK;
    err->message[0] = '\0';
    if (share == NULL || share->struct_size < sizeof(size_t) ||
        share->participants < 1)
        return hcb_error_set(err, HCB_EINVAL,
                             "a shared call needs a share with at least one "
                             "participant");
    if (share->participants == 1 && device != share->runner)
        return hcb_error_set(err, HCB_EINVAL,
                             "device %s:%d shares a call with no one: its "
                             "runner is %s:%d",
                             hcb__platform_name(device),
                             (int)HCB_DEVICE_ORDINAL(device),
                             hcb__platform_name(share->runner),
                             (int)HCB_DEVICE_ORDINAL(share->runner));
    return HCB_OK;
}

int
hcb__share(hcb_runtime *rt, const hcb_share *share, uint64_t id,
           hcb_device device, hcb__share_work work, void *ctx,
           const hcb_array *results, size_t nresults, hcb_error *err)
{
    int rc;

    if ((rc = check_share(share, device, err)) != HCB_OK)
        return rc;
    if (share->participants == 1)
        return work(ctx, err);
    return meet(rt, share, id, device, work, ctx, results, nresults, err);
}

typedef struct call_work {
    hcb_runtime *rt;
    uint64_t id;
    hcb_device device;
    const hcb_array *args, *results;
    size_t nargs, nresults;
} call_work;

static int
run_call(void *ctx, hcb_error *err)
{
    call_work *w = ctx;

    return hcb_runtime_call(w->rt, w->id, w->device, w->args, w->nargs,
                            w->results, w->nresults, err);
}

int
hcb_runtime_call_shared(hcb_runtime *rt, const hcb_share *share, uint64_t id,
                        hcb_device device, const hcb_array *args, size_t nargs,
                        const hcb_array *results, size_t nresults,
                        hcb_error *err)
{
    /* run as the runner, by whichever participant runs it */
    call_work w = {.rt = rt,
                   .id = id,
                   .device = share == NULL ? device : share->runner,
                   .args = args,
                   .results = results,
                   .nargs = nargs,
                   .nresults = nresults};
    hcb_error local;

    if (err == NULL)
        err = &local;
    return hcb__share(rt, share, id, device, run_call, &w, results, nresults,
                      err);
}

typedef struct deliver_work {
    hcb_runtime *rt;
    hcb_record *rec;
    int flags;
} deliver_work;

static int
run_delivery(void *ctx, hcb_error *err)
{
    deliver_work *w = ctx;
    hcb_record *rec = w->rec;

    w->rec = NULL; /* hcb_runtime_deliver takes it */
    return hcb_runtime_deliver(w->rt, rec, w->flags, err);
}

int
hcb_runtime_deliver_shared(hcb_runtime *rt, const hcb_share *share, uint64_t id,
                           hcb_device device, hcb_record *rec, int flags,
                           hcb_error *err)
{
    deliver_work w = {rt, rec, flags};
    hcb_error local;
    int rc;

    if (err == NULL)
        err = &local;
    if ((rc = check_share(share, device, err)) != HCB_OK) {
        hcb_record_release(rec);
        return rc;
    }
    if (first_runs(share) ? rec == NULL || rec->device != share->runner
                          : (device == share->runner) != (rec != NULL)) {
        rc = hcb_error_set(err, HCB_EINVAL,
                           first_runs(share)
                               ? "shared tap %llu: every participant passes "
                                 "a record made for the runner"
                               : "shared tap %llu: the runner, and it alone, "
                                 "passes a record",
                           (unsigned long long)id);
        hcb_record_release(rec);
        return rc;
    }
    rc = hcb__share(rt, share, id, device, run_delivery, &w, NULL, 0, err);
    hcb_record_release(w.rec); /* not delivered: another ran it, or the
                                  meeting failed */
    return rc;
}
