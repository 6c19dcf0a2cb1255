/*
 * cuda.c - finding the CUDA runtime at run time.
 *
 * JAX's CUDA plugin brings libcudart (from NVIDIA's pip packages, or the
 * system's); by the time a CUDA computation calls one of our handlers, the
 * plugin has loaded it.  So the first handler looks for the library already
 * in the process (RTLD_NOLOAD), then loads the path Python found for it
 * (hcb_cuda_load), then tries the names the CUDA 13 and 12 runtimes go by.
 * The functions are looked up once; the table never changes after that,
 * and the library is never unloaded.
 */
#define _GNU_SOURCE /* RTLD_NOLOAD */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "ffi/cuda.h"
#include "hcb/ffi.h"

static const char *const sonames[] = {"libcudart.so.13", "libcudart.so.12",
                                      "libcudart.so"};

static hcb__cuda loaded;                      /* filled once, under load_mu */
static _Atomic(const hcb__cuda *) api_in_use; /* NULL until loaded */
static hcb__mutex load_mu = {PTHREAD_MUTEX_INITIALIZER};

/* Fills `loaded` from `lib`: false, naming the missing function in `err`,
 * if the library lacks one. */
static bool
bind(void *lib, const char *where, hcb_error *err)
{
    static const struct {
        const char *symbol;
        size_t offset;
    } fns[] = {
        {"cudaMemcpyAsync", offsetof(hcb__cuda, memcpy_async)},
        {"cudaMemsetAsync", offsetof(hcb__cuda, memset_async)},
        {"cudaStreamSynchronize", offsetof(hcb__cuda, stream_synchronize)},
        {"cudaHostAlloc", offsetof(hcb__cuda, host_alloc)},
        {"cudaFreeHost", offsetof(hcb__cuda, free_host)},
        {"cudaGetErrorString", offsetof(hcb__cuda, error_string)},
        {"cudaEventCreateWithFlags", offsetof(hcb__cuda, event_create)},
        {"cudaEventRecord", offsetof(hcb__cuda, event_record)},
        {"cudaStreamWaitEvent", offsetof(hcb__cuda, stream_wait_event)},
        {"cudaEventDestroy", offsetof(hcb__cuda, event_destroy)},
        {"cudaEventSynchronize", offsetof(hcb__cuda, event_synchronize)},
        {"cudaEventQuery", offsetof(hcb__cuda, event_query)},
        {"cudaGetDevice", offsetof(hcb__cuda, get_device)},
        {"cudaSetDevice", offsetof(hcb__cuda, set_device)},
    };
    hcb__cuda table;
    size_t i;

    for (i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        void *fn = dlsym(lib, fns[i].symbol);

        if (fn == NULL) {
            hcb_error_set(err, HCB_ENOTFOUND, "%s has no %s", where,
                          fns[i].symbol);
            return false;
        }
        /* a function pointer stored through its slot's bytes: POSIX
         * guarantees dlsym's result converts */
        memcpy((char *)&table + fns[i].offset, &fn, sizeof fn);
    }
    loaded = table;
    return true;
}

/* Tries one library; on failure appends why to `tried`. */
static bool
try_open(const char *name, int flags, char *tried, size_t cap)
{
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL | flags);
    size_t used = strlen(tried);
    hcb_error why;

    if (lib != NULL && bind(lib, name, &why))
        return true;
    if (lib == NULL) {
        if (flags & RTLD_NOLOAD)
            return false; /* not in the process: nothing to report */
        snprintf(why.message, sizeof why.message, "%s", dlerror());
    }
    snprintf(tried + used, cap - used, "%s%s", used > 0 ? "; " : "",
             why.message);
    return false;
}

int
hcb_cuda_load(const char *path, hcb_error *err)
{
    char tried[sizeof err->message] = "";
    bool ok = false;
    size_t i;

    if (atomic_load_explicit(&api_in_use, memory_order_acquire) != NULL)
        return HCB_OK;
    hcb__mutex_lock(&load_mu);
    if (atomic_load_explicit(&api_in_use, memory_order_relaxed) != NULL)
        ok = true;
    for (i = 0; !ok && i < sizeof sonames / sizeof sonames[0]; i++)
        ok = try_open(sonames[i], RTLD_NOLOAD, tried, sizeof tried);
    if (!ok && path != NULL)
        ok = try_open(path, 0, tried, sizeof tried);
    for (i = 0; !ok && i < sizeof sonames / sizeof sonames[0]; i++)
        ok = try_open(sonames[i], 0, tried, sizeof tried);
    if (ok && atomic_load_explicit(&api_in_use, memory_order_relaxed) == NULL)
        atomic_store_explicit(&api_in_use, &loaded, memory_order_release);
    hcb__mutex_unlock(&load_mu);
    if (!ok)
        return hcb_error_set(err, HCB_ENOTFOUND,
                             "cannot load the CUDA runtime (libcudart), "
                             "which JAX's CUDA plugin brings: %s",
                             tried);
    return HCB_OK;
}

const hcb__cuda *
hcb__cuda_get(hcb_error *err)
{
    const hcb__cuda *api =
        atomic_load_explicit(&api_in_use, memory_order_acquire);

    if (api == NULL && hcb_cuda_load(NULL, err) == HCB_OK)
        api = atomic_load_explicit(&api_in_use, memory_order_acquire);
    return api;
}

void
hcb__cuda_install(const hcb__cuda *api)
{
    atomic_store_explicit(&api_in_use, api, memory_order_release);
}

int
hcb__cuda_fail(const hcb__cuda *api, int status, const char *what,
               hcb_error *err)
{
    const char *msg = api->error_string(status);

    return hcb_error_set(err, HCB_ESYSTEM, "%s: %s (CUDA error %d)", what,
                         msg != NULL ? msg : "unknown error", status);
}

int
hcb__cuda_switch_device(const hcb__cuda *api, int ordinal, int *previous,
                        hcb_error *err)
{
    char what[64];
    int current = -1, status;

    *previous = -1;
    if ((status = api->get_device(&current)) != 0)
        return hcb__cuda_fail(api, status, "reading the thread's CUDA device",
                              err);
    if (current == ordinal)
        return HCB_OK;
    if ((status = api->set_device(ordinal)) != 0) {
        snprintf(what, sizeof what, "switching to CUDA device %d", ordinal);
        return hcb__cuda_fail(api, status, what, err);
    }
    *previous = current;
    return HCB_OK;
}

int
hcb_cuda_stream_wait(int32_t ordinal, void *waiter, void *stream,
                     hcb_error *err)
{
    const hcb__cuda *api;
    void *event = NULL;
    int previous, rc, status;

    if (waiter == stream)
        return HCB_OK; /* a stream is in order with itself */
    if ((api = hcb__cuda_get(err)) == NULL)
        return HCB_ENOTFOUND; /* `err` may be NULL: no err->code */
    /* The event must be made on the device of the stream it is recorded
     * on, and the default streams (1, 2) are the current device's: the
     * thread's device may be another (a callback switched it), so it is
     * switched for these calls and given back after. */
    if ((rc = hcb__cuda_switch_device(api, ordinal, &previous, err)) != HCB_OK)
        return rc;
    if ((status = api->event_create(&event, HCB__CUDA_EVENT_DISABLE_TIMING)) !=
        0) {
        rc = hcb__cuda_fail(api, status, "creating a CUDA event", err);
    } else {
        /* the wait holds what it needs of the event: destroying it right
         * after is allowed, and CUDA frees it once the wait is done */
        if ((status = api->event_record(event, stream)) == 0)
            status = api->stream_wait_event(waiter, event, 0);
        (void)api->event_destroy(event);
        if (status != 0)
            rc = hcb__cuda_fail(api, status,
                                "making one CUDA stream wait for another", err);
    }
    if (previous >= 0 && (status = api->set_device(previous)) != 0 &&
        rc == HCB_OK)
        rc = hcb__cuda_fail(
            api, status, "switching the thread back to its CUDA device", err);
    return rc;
}
