/*
 * common.h - internal helpers shared by the files of libhcb: the allocation
 * hook, the pthread wrappers and the clock.  Not installed.
 */
#ifndef HCB_COMMON_H
#define HCB_COMMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hcb/hcb.h"

/* Internal functions are `hcb__` and hidden; the HCB_API ones are exported. */

/* Allocation through the hook set by hcb_set_allocator.  hcb__calloc zeroes
 * and checks n * size for overflow.  hcb__free(NULL) does nothing. */
void *hcb__malloc(size_t size);
void *hcb__calloc(size_t n, size_t size);
void hcb__free(void *ptr);
/* The record pools (record.c) keep blocks they took from the hook; the hook
 * gives them back through this before it changes. */
void hcb__record_drain(void);

/* Thin pthread wrappers.  A failure of lock/unlock/wait/signal means a
 * corrupted object or a bug, so they abort with a message instead of
 * returning codes nobody can handle.  Creation can fail (resources) and
 * returns an HCB_E* code. */
typedef struct hcb__mutex {
    pthread_mutex_t m;
} hcb__mutex;

typedef struct hcb__cond {
    pthread_cond_t c;
} hcb__cond;

int hcb__mutex_init(hcb__mutex *mu);
void hcb__mutex_destroy(hcb__mutex *mu);
void hcb__mutex_lock(hcb__mutex *mu);
void hcb__mutex_unlock(hcb__mutex *mu);

/* A pause for spin loops: tells the CPU this is a busy wait. */
static inline void
hcb__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Thread-local variables of libhcb: initial-exec, so that reading one is a
 * plain load instead of a __tls_get_addr call (libhcb has two pointers'
 * worth; the C library reserves room for that in dlopen'ed objects). */
#if defined(__GNUC__) || defined(__clang__)
#define HCB__TLS _Thread_local __attribute__((tls_model("initial-exec")))
#else
#define HCB__TLS _Thread_local
#endif

int hcb__cond_init(hcb__cond *cv); /* waits use CLOCK_MONOTONIC */
void hcb__cond_destroy(hcb__cond *cv);
void hcb__cond_wait(hcb__cond *cv, hcb__mutex *mu);
/* Waits until signalled or until hcb__now_ns() passes `deadline_ns`;
 * false on timeout. */
bool hcb__cond_wait_until(hcb__cond *cv, hcb__mutex *mu, uint64_t deadline_ns);
void hcb__cond_signal(hcb__cond *cv);
void hcb__cond_broadcast(hcb__cond *cv);

/* Starts a named thread (name truncated to 15 bytes, the Linux limit). */
int hcb__thread_create(pthread_t *t, const char *name, void *(*fn)(void *),
                       void *arg);
void hcb__thread_join(pthread_t t);

/* Monotonic clock in nanoseconds. */
uint64_t hcb__now_ns(void);

#endif /* HCB_COMMON_H */
