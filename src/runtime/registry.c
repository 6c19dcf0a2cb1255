/*
 * registry.c - the registry of tap and call targets: an append-only table
 * of chunks, read without a lock (ids are published with release stores),
 * appended under rt->mu.  A record or a call names its target by id.
 */
#include <string.h>

#include "runtime/runtime.h"

/* Appends a target and publishes it; returns its id through `id`. */
static int
target_add(hcb_runtime *rt, const target *t, uint64_t *id, hcb_error *err)
{
    target *chunk;
    uint64_t n;

    hcb__mutex_lock(&rt->mu);
    n = atomic_load_explicit(&rt->ntargets, memory_order_relaxed);
    if (n >= (uint64_t)TARGET_CHUNK * TARGET_CHUNKS) {
        hcb__mutex_unlock(&rt->mu);
        return hcb_error_set(err, HCB_ESTATE,
                             "target registry is full (%llu targets)",
                             (unsigned long long)n);
    }
    chunk = atomic_load_explicit(&rt->chunks[n / TARGET_CHUNK],
                                 memory_order_relaxed);
    if (chunk == NULL) {
        chunk = hcb__calloc(TARGET_CHUNK, sizeof *chunk);
        if (chunk == NULL) {
            hcb__mutex_unlock(&rt->mu);
            return hcb_error_set(err, HCB_ENOMEM,
                                 "cannot grow the target registry");
        }
        atomic_store_explicit(&rt->chunks[n / TARGET_CHUNK], chunk,
                              memory_order_release);
    }
    chunk[n % TARGET_CHUNK] = *t;
    atomic_store_explicit(&rt->ntargets, n + 1, memory_order_release);
    hcb__mutex_unlock(&rt->mu);
    *id = n + 1;
    return HCB_OK;
}

static void
target_name(target *t, const char *name, size_t len)
{
    if (name == NULL)
        len = 0;
    if (len >= NAME_SIZE)
        len = NAME_SIZE - 1;
    if (len > 0)
        memcpy(t->name, name, len);
    t->name[len] = '\0';
}

int
hcb_runtime_register_tap(hcb_runtime *rt, const hcb_tap_target *t, uint64_t *id,
                         hcb_error *err)
{
    target slot = {TARGET_TAP, NULL, NULL, NULL, ""};

    if (t == NULL || t->struct_size < sizeof(hcb_tap_target) || t->fn == NULL ||
        id == NULL)
        return hcb_error_set(err, HCB_EINVAL,
                             "tap target needs struct_size, fn and an id "
                             "pointer");
    slot.tap = t->fn;
    slot.user = t->user;
    target_name(&slot, t->name, t->name_len);
    return target_add(rt, &slot, id, err);
}

int
hcb_runtime_register_call(hcb_runtime *rt, const hcb_call_target *t,
                          uint64_t *id, hcb_error *err)
{
    target slot = {TARGET_CALL, NULL, NULL, NULL, ""};

    if (t == NULL || t->struct_size < sizeof(hcb_call_target) ||
        t->fn == NULL || id == NULL)
        return hcb_error_set(err, HCB_EINVAL,
                             "call target needs struct_size, fn and an id "
                             "pointer");
    slot.call = t->fn;
    slot.user = t->user;
    target_name(&slot, t->name, t->name_len);
    return target_add(rt, &slot, id, err);
}
