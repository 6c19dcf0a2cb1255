/*
 * interrupt.c - Ctrl-C while the main thread waits in libhcb.
 *
 * A device's thread waits inside libhcb when its queue is full (a submit,
 * or a GPU tap's reservation), when a call or a tap delivered now waits for
 * the taps its device queued before it, and when a GPU waits for its pinned
 * pool.  That thread is XLA's: most often the caller's own (Python's main
 * thread, inside jaxlib with the GIL released: XLA's CPU client runs a
 * computation in the thread that dispatches it), else a worker.  Python
 * runs its signal handlers only on the main thread and only when that
 * thread runs Python, which it does not while it waits inside the
 * computation.  So a Ctrl-C would go unseen for as long as a callback
 * function kept the device waiting, forever if it never returned.
 *
 * The runtime's interrupt check (hcb_runtime_set_interrupt), which every
 * one of those waits calls as it begins and every 50 ms, lets the waiting
 * thread notice it: SIGINT's handler is chained with a counter of SIGINTs,
 * and a wait on the main thread that sees the counter move since it began
 * stops.  Its computation fails ("... interrupted while waiting ...:
 * Ctrl-C (SIGINT)"), the records queued before are delivered as usual, and
 * Python's own handler, which the chain calls first, then runs as soon as
 * the main thread runs Python again (KeyboardInterrupt by default).
 *
 * Ctrl-C is the main thread's.  A wait on another thread belongs either to
 * another Python thread's computation, which goes on as in JAX, or to the
 * main thread's own, run by an XLA worker while the main thread waits for
 * it inside jaxlib (a computation whose kernels XLA parallelised ends on
 * the worker that finished last).  The main thread tells them apart: such
 * a wait, seeing a SIGINT since it began, asks the main thread to note it
 * (Py_AddPendingCall, which needs neither the GIL nor a thread state).  A
 * main thread that runs Python takes the SIGINT as KeyboardInterrupt and
 * notes it within milliseconds: the wait goes on.  One that has not noted
 * it after TAKE_NS waits inside a computation, most likely this one, and
 * would not see Ctrl-C before that computation ends: the wait stops.
 *
 * The check takes no lock but its own and never the GIL, so it is safe on
 * any thread.  A SIGINT that came before the wait began is Python's alone:
 * it is handled once the main thread runs Python again (press Ctrl-C again
 * to end a wait that began after it).
 *
 * barrier_wait is not such a wait: it runs in a Python thread, which runs
 * the signal handlers itself while it waits (module.c, hcb_barrier).
 *
 * The chain: at configure, and again as each wait starts (Python puts its
 * own handler back whenever signal.signal(SIGINT, ...) is called), if
 * SIGINT's handler is a function and not ours, ours is installed in front
 * of it.  SIG_DFL and SIG_IGN are left alone.  `hook_mu` (a leaf: nothing
 * is taken under it) serialises the re-installs.
 */
#include "hcbpy.h" /* first: Python.h sets the POSIX feature macros */

#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* SIGINTs received since the process started (the handler's counter). */
static atomic_uint_fast64_t sigints;

/* The handler ours calls after counting: at most one is non-NULL, set under
 * hook_mu before ours is installed, read by the handler. */
static _Atomic(void (*)(int)) next_handler;
static _Atomic(void (*)(int, siginfo_t *, void *)) next_action;

static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;

static void
on_sigint(int sig, siginfo_t *info, void *context)
{
    void (*action)(int, siginfo_t *, void *) = atomic_load(&next_action);
    void (*handler)(int) = atomic_load(&next_handler);

    atomic_fetch_add(&sigints, 1);
    if (action != NULL)
        action(sig, info, context);
    else if (handler != NULL)
        handler(sig);
}

/* Puts on_sigint in front of SIGINT's handler unless it is there already
 * or the handler is SIG_DFL or SIG_IGN. */
static void
hook_sigint(void)
{
    struct sigaction now, ours;

    pthread_mutex_lock(&hook_mu);
    if (sigaction(SIGINT, NULL, &now) == 0 &&
        !((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigint)) {
        if (now.sa_flags & SA_SIGINFO) {
            atomic_store(&next_handler, NULL);
            atomic_store(&next_action, now.sa_sigaction);
        } else if (now.sa_handler != SIG_DFL && now.sa_handler != SIG_IGN) {
            atomic_store(&next_action, NULL);
            atomic_store(&next_handler, now.sa_handler);
        } else {
            pthread_mutex_unlock(&hook_mu);
            return;
        }
        memset(&ours, 0, sizeof ours);
        ours.sa_sigaction = on_sigint;
        ours.sa_mask = now.sa_mask;
        ours.sa_flags = (now.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
        (void)sigaction(SIGINT, &ours, NULL);
    }
    pthread_mutex_unlock(&hook_mu);
}

/* Whether the calling thread is the process's main thread, Python's
 * (Linux: its thread id is the process id), the one Ctrl-C interrupts. */
static bool
on_main_thread(void)
{
    return (pid_t)syscall(SYS_gettid) == getpid();
}

/* The SIGINT count the main thread last noted while running Python
 * (note_sigints, a pending call), and the count it was last asked to note
 * and when (now_ns's clock). */
static atomic_uint_fast64_t noted;
static atomic_uint_fast64_t asked;
static atomic_uint_fast64_t asked_ns;

/* How long a main thread that runs Python may take to note a SIGINT. */
#define TAKE_NS 200000000u

static uint64_t
now_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Runs on the main thread, with the GIL, when it next runs Python. */
static int
note_sigints(void *count)
{
    uint64_t c = (uint64_t)(uintptr_t)count;
    uint64_t was = atomic_load(&noted);

    while (was < c && !atomic_compare_exchange_weak(&noted, &was, c))
        ;
    return 0;
}

/* For a wait on a thread other than the main one that has seen `count`
 * SIGINTs: whether the main thread left them unnoted for TAKE_NS (it waits
 * inside a computation, most likely the waiting one's). */
static bool
main_thread_is_stuck(uint64_t count)
{
    uint64_t now = now_ns();

    if (atomic_load(&noted) >= count)
        return false; /* taken as Python's: another thread's computation */
    if (atomic_load(&asked) < count) {
        if (!Py_IsInitialized() ||
            Py_AddPendingCall(note_sigints, (void *)(uintptr_t)count) != 0)
            return false; /* asked again at the next poll */
        atomic_store(&asked_ns, now);
        atomic_store(&asked, count);
        return false;
    }
    return now - atomic_load(&asked_ns) >= TAKE_NS;
}

/* The interrupt check (hcb_check_fn): `*state` holds 1 + the count of
 * SIGINTs when this wait began; a SIGINT since stops the wait on the main
 * thread, and on another thread once the main thread has left it unnoted
 * for TAKE_NS. */
static int
stop_on_sigint(void *user, hcb_device device, uint64_t *state, hcb_error *err)
{
    uint64_t count = atomic_load(&sigints);

    (void)user;
    (void)device;
    if (*state == 0) {
        hook_sigint();
        *state = count + 1;
        return 0;
    }
    if (count + 1 == *state)
        return 0;
    if (!on_main_thread() && !main_thread_is_stuck(count))
        return 0;
    hcb_error_set(err, HCB_ECALLBACK, "Ctrl-C (SIGINT)");
    return 1;
}

/* How often a waiting device's thread looks for a Ctrl-C. */
#define INTERRUPT_POLL_NS 50000000u

void
hcb_py_interrupt_install(hcb_state *st)
{
    hook_sigint();
    /* cannot fail: the interval is positive */
    (void)hcb_runtime_set_interrupt(st->rt, INTERRUPT_POLL_NS, stop_on_sigint,
                                    NULL, NULL);
}

void
hcb_py_interrupt_uninstall(hcb_state *st)
{
    (void)hcb_runtime_set_interrupt(st->rt, 0, NULL, NULL, NULL);
}
