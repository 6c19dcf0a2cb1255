/*
 * sync.c - pthread wrappers that abort on impossible failures, and the clock.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/common.h"

static void
die(const char *what, int rc)
{
    fprintf(stderr, "libhcb: fatal: %s failed: %s\n", what, strerror(rc));
    abort();
}

int
hcb__mutex_init(hcb__mutex *mu)
{
    pthread_mutexattr_t attr;
    int rc;

    if (pthread_mutexattr_init(&attr) != 0)
        return HCB_ESYSTEM;
#ifdef __GLIBC__
    /* spins a little before it sleeps: our critical sections are short,
     * and a futex sleep and wake-up costs more than they do */
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
    rc = pthread_mutex_init(&mu->m, &attr);
    pthread_mutexattr_destroy(&attr);
    return rc == 0 ? HCB_OK : HCB_ESYSTEM;
}

void
hcb__mutex_destroy(hcb__mutex *mu)
{
    int rc = pthread_mutex_destroy(&mu->m);

    if (rc != 0)
        die("pthread_mutex_destroy", rc);
}

void
hcb__mutex_lock(hcb__mutex *mu)
{
    int rc = pthread_mutex_lock(&mu->m);

    if (rc != 0)
        die("pthread_mutex_lock", rc);
}

void
hcb__mutex_unlock(hcb__mutex *mu)
{
    int rc = pthread_mutex_unlock(&mu->m);

    if (rc != 0)
        die("pthread_mutex_unlock", rc);
}

int
hcb__cond_init(hcb__cond *cv)
{
    pthread_condattr_t attr;
    int rc;

    if (pthread_condattr_init(&attr) != 0)
        return HCB_ESYSTEM;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&cv->c, &attr);
    pthread_condattr_destroy(&attr);
    return rc == 0 ? HCB_OK : HCB_ESYSTEM;
}

void
hcb__cond_destroy(hcb__cond *cv)
{
    int rc = pthread_cond_destroy(&cv->c);

    if (rc != 0)
        die("pthread_cond_destroy", rc);
}

void
hcb__cond_wait(hcb__cond *cv, hcb__mutex *mu)
{
    int rc = pthread_cond_wait(&cv->c, &mu->m);

    if (rc != 0)
        die("pthread_cond_wait", rc);
}

bool
hcb__cond_wait_until(hcb__cond *cv, hcb__mutex *mu, uint64_t deadline_ns)
{
    struct timespec ts;
    int rc;

    ts.tv_sec = (time_t)(deadline_ns / 1000000000u);
    ts.tv_nsec = (long)(deadline_ns % 1000000000u);
    rc = pthread_cond_timedwait(&cv->c, &mu->m, &ts);
    if (rc != 0 && rc != ETIMEDOUT)
        die("pthread_cond_timedwait", rc);
    return rc == 0;
}

void
hcb__cond_signal(hcb__cond *cv)
{
    int rc = pthread_cond_signal(&cv->c);

    if (rc != 0)
        die("pthread_cond_signal", rc);
}

void
hcb__cond_broadcast(hcb__cond *cv)
{
    int rc = pthread_cond_broadcast(&cv->c);

    if (rc != 0)
        die("pthread_cond_broadcast", rc);
}

int
hcb__thread_create(pthread_t *t, const char *name, void *(*fn)(void *),
                   void *arg)
{
    char buf[16];

    if (pthread_create(t, NULL, fn, arg) != 0)
        return HCB_ESYSTEM;
    snprintf(buf, sizeof buf, "%s", name);
    pthread_setname_np(*t, buf); /* cosmetic: failure is harmless */
    return HCB_OK;
}

void
hcb__thread_join(pthread_t t)
{
    int rc = pthread_join(t, NULL);

    if (rc != 0)
        die("pthread_join", rc);
}

uint64_t
hcb__now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
