/*
 * hcb.h - the public C API of libhcb, the host-callback runtime.
 *
 * libhcb moves data that a device computation "taps" to host functions that
 * run on one consumer thread per device.  It has no dependency on Python: the
 * CPython extension of the `host_callback` package is one client of this API,
 * a C program is another.
 *
 * Conventions (see docs/ and STYLE.md):
 *   - Functions return 0 (HCB_OK) or a negative HCB_E* code.  Those that can
 *     explain take a last `hcb_error *err` (may be NULL) that receives a
 *     message; filling it never allocates.
 *   - Structs that may grow start with `size_t struct_size` and come with an
 *     HCB_*_INIT initializer.  Everything else is an opaque handle.
 *   - Every pointer says who owns it.  "Borrowed" means for the duration of
 *     the call unless stated otherwise.
 *   - Every function is thread-safe unless its comment says otherwise.
 *
 * This header includes only standard headers and compiles as C11 and C++.
 */
#ifndef HCB_HCB_H
#define HCB_HCB_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define HCB_API          __attribute__((visibility("default")))
#define HCB_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define HCB_API
#define HCB_PRINTF(f, a)
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */

#define HCB_VERSION_MAJOR 0
#define HCB_VERSION_MINOR 1
#define HCB_VERSION_PATCH 0
#define HCB_VERSION_NUMBER                                                     \
    (HCB_VERSION_MAJOR * 10000 + HCB_VERSION_MINOR * 100 + HCB_VERSION_PATCH)

/* The version of the library loaded at run time, as HCB_VERSION_NUMBER
 * encodes it.  Compare with HCB_VERSION_NUMBER to detect a header/library
 * mismatch. */
HCB_API int hcb_version(void);

/* The same version as a static string, e.g. "0.1.0". */
HCB_API const char *hcb_version_string(void);

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */

/* Status codes.  Each maps onto one XLA_FFI_Error_Code at the FFI edge
 * (hcb/ffi.h, hcb_ffi_error_code). */
enum {
    HCB_OK = 0,
    HCB_EINVAL = -1,    /* bad argument            -> INVALID_ARGUMENT */
    HCB_ENOMEM = -2,    /* allocation failed       -> RESOURCE_EXHAUSTED */
    HCB_ENOTFOUND = -3, /* unknown id or device    -> NOT_FOUND */
    HCB_ESTATE = -4,    /* wrong state for the op  -> FAILED_PRECONDITION */
    HCB_EDEADLK = -5,   /* the wait would deadlock -> ABORTED */
    HCB_ECALLBACK = -6, /* a user callback failed  -> UNKNOWN */
    HCB_EUNIMPL = -7,   /* not supported           -> UNIMPLEMENTED */
    HCB_EINTERNAL = -8, /* broken invariant        -> INTERNAL */
    HCB_ESYSTEM = -9    /* the OS refused (threads) -> UNAVAILABLE */
};

#define HCB_ERROR_MESSAGE_SIZE 2048

/* An error report.  The message is lowercase, failure first, with no trailing
 * period, and always NUL-terminated (truncated if needed). */
typedef struct hcb_error {
    int code; /* one of HCB_E*, or HCB_OK */
    char message[HCB_ERROR_MESSAGE_SIZE];
} hcb_error;

/* Sets `err` (if not NULL) and returns `code`, so that error paths read
 * `return hcb_error_set(err, HCB_EINVAL, "...", ...);`. */
HCB_API int hcb_error_set(hcb_error *err, int code, const char *fmt, ...)
    HCB_PRINTF(3, 4);
HCB_API int hcb_error_setv(hcb_error *err, int code, const char *fmt,
                           va_list ap);

/* A static description of a code, e.g. "invalid argument". */
HCB_API const char *hcb_strerror(int code);

/* ------------------------------------------------------------------------ */
/* Allocation                                                               */

/* Every allocation libhcb makes goes through this hook.  Set it before any
 * other call into the library; NULL restores malloc/free.  `alloc` returns
 * memory aligned like malloc's (max_align_t), or NULL on failure, which every
 * caller handles.  Not thread-safe with
 * concurrent library use. */
typedef struct hcb_allocator {
    size_t struct_size;
    void *(*alloc)(void *user, size_t size);
    void (*free)(void *user, void *ptr);
    void *user; /* borrowed; must outlive its use by the library */
} hcb_allocator;

HCB_API void hcb_set_allocator(const hcb_allocator *allocator);

/* ------------------------------------------------------------------------ */
/* Element types and array views                                            */

/* Element types.  The values are XLA's (XLA_FFI_DataType, PrimitiveType), so
 * an FFI buffer's dtype converts by a cast. */
typedef enum hcb_dtype {
    HCB_INVALID = 0,
    HCB_BOOL = 1,
    HCB_S8 = 2,
    HCB_S16 = 3,
    HCB_S32 = 4,
    HCB_S64 = 5,
    HCB_U8 = 6,
    HCB_U16 = 7,
    HCB_U32 = 8,
    HCB_U64 = 9,
    HCB_F16 = 10,
    HCB_F32 = 11,
    HCB_F64 = 12,
    HCB_C64 = 15,
    HCB_BF16 = 16,
    HCB_TOKEN = 17,
    HCB_C128 = 18,
    HCB_F8E5M2 = 19,
    HCB_F8E4M3FN = 20,
    HCB_S4 = 21,
    HCB_U4 = 22,
    HCB_F8E4M3B11FNUZ = 23,
    HCB_F8E5M2FNUZ = 24,
    HCB_F8E4M3FNUZ = 25,
    HCB_S2 = 26,
    HCB_U2 = 27,
    HCB_F8E4M3 = 28,
    HCB_F8E3M4 = 29,
    HCB_F4E2M1FN = 32,
    HCB_F8E8M0FNU = 33
} hcb_dtype;

/* Bytes per element, or 0 for a type that has no byte-addressable elements
 * (invalid, token, and the sub-byte types S2, U2, S4, U4, F4E2M1FN). */
HCB_API size_t hcb_dtype_size(hcb_dtype dtype);

/* Bits per element (1 to 128), or 0 for invalid and token.  Below 8 the
 * type is a sub-byte type: see hcb_dtype_nbytes. */
HCB_API size_t hcb_dtype_bits(hcb_dtype dtype);

/* The bytes `count` elements take in XLA's layout, the layout of every
 * hcb_array (XLA buffers, records, what native callbacks see):
 * count * hcb_dtype_size, except that sub-byte elements are packed, 8 / bits
 * to a byte, element i in bits (i * bits) % 8 and up of byte i * bits / 8
 * (the low bits first), the last byte padded with zero bits.  SIZE_MAX when
 * the type has no size or the count overflows. */
HCB_API size_t hcb_dtype_nbytes(hcb_dtype dtype, size_t count);

/* Converts `count` elements of a sub-byte type between XLA's packed layout
 * and numpy's (ml_dtypes': one element per byte, in its low bits, the high
 * bits zero).  unpack reads hcb_dtype_nbytes(dtype, count) bytes of
 * `packed` and writes `count` bytes to `bytes`; pack the reverse (it reads
 * only the low bits of each byte and zeroes the padding).  For the other
 * types both copy hcb_dtype_nbytes(dtype, count) bytes.  The buffers are
 * borrowed for the call and must not overlap. */
HCB_API void hcb_unpack_elements(hcb_dtype dtype, const void *packed,
                                 size_t count, void *bytes);
HCB_API void hcb_pack_elements(hcb_dtype dtype, const void *bytes, size_t count,
                               void *packed);

/* numpy's name for the type ("float32", "bfloat16", "bool"), or "invalid". */
HCB_API const char *hcb_dtype_name(hcb_dtype dtype);

#define HCB_MAX_RANK 64

/* A view of one dense, row-major array.  A view owns nothing: `dims` and
 * `data` belong to whatever produced the view (a record, an XLA buffer) and
 * live as long as it does. */
typedef struct hcb_array {
    hcb_dtype dtype;
    int32_t rank;        /* 0 .. HCB_MAX_RANK */
    const int64_t *dims; /* `rank` extents; may be NULL when rank is 0 */
    void *data;          /* may be NULL when nbytes is 0 */
    size_t nbytes;       /* hcb_dtype_nbytes(dtype, product(dims)) */
} hcb_array;

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */

/* A device key names the queue a record goes to: a platform and the device
 * ordinal XLA reports (on CPU, jax.Device.id). */
typedef int64_t hcb_device;

enum { HCB_PLATFORM_CPU = 0, HCB_PLATFORM_CUDA = 1 };

#define HCB_DEVICE(platform, ordinal)                                          \
    ((hcb_device)(((uint64_t)(uint32_t)(platform) << 32) |                     \
                  (uint64_t)(uint32_t)(ordinal)))
#define HCB_DEVICE_PLATFORM(d) ((int32_t)((uint64_t)(d) >> 32))
#define HCB_DEVICE_ORDINAL(d)  ((int32_t)(uint32_t)((uint64_t)(d)&0xffffffffu))
/* "Every device", where an argument accepts it. */
#define HCB_ALL_DEVICES ((hcb_device)-1)

/* ------------------------------------------------------------------------ */
/* Records                                                                  */

/* A record is what one tap sends to the host: the callback id, the device,
 * and a copy of the tapped arrays, in one allocation.  Records are reference
 * counted; the creator holds one reference. */
typedef struct hcb_record hcb_record;

/* Creates a record that copies `nargs` arrays (borrowed; only read during
 * the call).  On success `*out` owns one reference.  Errors: HCB_EINVAL for a
 * malformed view (rank, dtype, nbytes inconsistent with dims), HCB_ENOMEM. */
HCB_API int hcb_record_create(uint64_t callback_id, hcb_device device,
                              const hcb_array *args, size_t nargs,
                              hcb_record **out, hcb_error *err);

/* Reference counting; thread-safe.  release(NULL) does nothing.  A record
 * of up to HCB_RECORD_SHARED_MAX bytes (hcb_record_size) shares a 64 KiB
 * block with the records made before and after it on its thread, and
 * keeping it keeps that block: copy out what a tap function keeps for long
 * rather than retain many small records. */
#define HCB_RECORD_SHARED_MAX 4096
HCB_API void hcb_record_retain(hcb_record *rec);
HCB_API void hcb_record_release(hcb_record *rec);

/* Accessors.  The returned arrays are owned by the record and stay valid
 * while the caller holds a reference; their data is writable by the holder
 * of the record (the copy is private to it). */
HCB_API uint64_t hcb_record_callback_id(const hcb_record *rec);
HCB_API hcb_device hcb_record_device(const hcb_record *rec);
HCB_API size_t hcb_record_nargs(const hcb_record *rec);
HCB_API const hcb_array *hcb_record_args(const hcb_record *rec);
/* Bytes this record occupies, the amount charged against a queue bound. */
HCB_API size_t hcb_record_size(const hcb_record *rec);

/* ------------------------------------------------------------------------ */
/* The runtime                                                              */

/* A runtime owns one bounded queue and one consumer thread per device, the
 * registry of tap targets, the recorded errors and the statistics. */
typedef struct hcb_runtime hcb_runtime;

/* 256e6 bytes, the legacy host_callback default. */
#define HCB_DEFAULT_MAX_QUEUE_BYTES ((size_t)256000000)

typedef struct hcb_runtime_options {
    size_t struct_size;
    /* Per-device bound on queued bytes.  A producer waits while its record
     * does not fit; a record larger than the bound passes once the queue is
     * empty.  Must be > 0. */
    size_t max_queue_bytes;
} hcb_runtime_options;

#define HCB_RUNTIME_OPTIONS_INIT                                               \
    {                                                                          \
        sizeof(hcb_runtime_options), HCB_DEFAULT_MAX_QUEUE_BYTES               \
    }

/* Creates a runtime; `options` may be NULL for the defaults.  No thread
 * starts until the first record for a device arrives. */
HCB_API int hcb_runtime_create(const hcb_runtime_options *options,
                               hcb_runtime **out, hcb_error *err);

/* Stops the runtime (draining every queue) and frees it.  NULL is ignored.
 * Must not be called from one of the runtime's consumer threads. */
HCB_API void hcb_runtime_destroy(hcb_runtime *rt);

/* The process-wide runtime that the FFI handlers feed, created on first use
 * with the default options and never destroyed.  NULL only if that first
 * creation ran out of memory. */
HCB_API hcb_runtime *hcb_runtime_default(void);

/* Tells the runtime the ordinal (jax.Device.id) of the process's only CPU
 * device, or -1 (the default) when there are several or it is not known.
 * With one, the hcb_tap and hcb_call handlers use it instead of asking XLA
 * for the ordinal on every call, a measurable part of a tap's cost.  Wrong
 * if the process has another CPU device: the taps would go to this one. */
HCB_API void hcb_runtime_set_only_cpu_device(hcb_runtime *rt, int32_t ordinal);

/* Changes the per-device bound for existing and future queues.  Producers
 * already waiting re-check against the new bound. */
HCB_API int hcb_runtime_set_max_queue_bytes(hcb_runtime *rt, size_t bytes,
                                            hcb_error *err);

/* A tap function.  It runs on the consumer thread of the record's device,
 * one record at a time per device, in the order the device produced them.
 * `rec` is borrowed for the call; hcb_record_retain it to keep the data
 * longer.  Return 0, or non-zero after filling `err`: the runtime then
 * records the error (hcb_runtime_take_error) and goes on.  From Python,
 * host_callback.native_tap(fn) makes one the tap function of id_tap: the
 * record's arrays are then the flattened leaves of the tapped value. */
typedef int (*hcb_tap_fn)(void *user, hcb_record *rec, hcb_error *err);

/* The most bytes of a target's name the runtime keeps (it keeps the first
 * HCB_NAME_MAX). */
#define HCB_NAME_MAX 63

typedef struct hcb_tap_target {
    size_t struct_size;
    hcb_tap_fn fn;    /* required */
    void *user;       /* borrowed; must outlive the runtime */
    const char *name; /* for messages; copied (HCB_NAME_MAX bytes at most) */
    size_t name_len;
} hcb_tap_target;

#define HCB_TAP_TARGET_INIT                                                    \
    {                                                                          \
        sizeof(hcb_tap_target), NULL, NULL, NULL, 0                            \
    }

/* Registers a tap target for the life of the runtime and gives its id
 * (never 0: compiled programs carry it as the `callback_id` attribute).
 * Errors: HCB_EINVAL, HCB_ENOMEM, HCB_ESTATE when the registry is full. */
HCB_API int hcb_runtime_register_tap(hcb_runtime *rt,
                                     const hcb_tap_target *target, uint64_t *id,
                                     hcb_error *err);

/* A call function: the host side of a synchronous call.  It runs on the
 * thread that runs the computation on `device` (an XLA thread), which waits
 * for it.  `args` are the operands, borrowed for the call only (copy what
 * you keep).  `results` describe the output buffers: their dtype and dims
 * are what the program declared, and the function must fill each
 * `results[i].data` with `results[i].nbytes` bytes.  Return 0, or non-zero
 * after filling `err`: the computation then fails with that message, and the
 * runtime records the error as for a failed tap.  Several devices may run
 * the same call function concurrently.  From Python,
 * host_callback.native_call(fn) makes one the function of call or
 * buffer_callback: `args` and `results` are then XLA's own buffers: on a
 * GPU (HCB_DEVICE_PLATFORM(device) == HCB_PLATFORM_CUDA) device pointers,
 * to be worked on in stream order on hcb_call_stream() (hcb/cuda.h). */
typedef int (*hcb_call_fn)(void *user, hcb_device device, const hcb_array *args,
                           size_t nargs, const hcb_array *results,
                           size_t nresults, hcb_error *err);

typedef struct hcb_call_target {
    size_t struct_size;
    hcb_call_fn fn;   /* required */
    void *user;       /* borrowed; must outlive the runtime */
    const char *name; /* for messages; copied (HCB_NAME_MAX bytes at most) */
    size_t name_len;
} hcb_call_target;

#define HCB_CALL_TARGET_INIT                                                   \
    {                                                                          \
        sizeof(hcb_call_target), NULL, NULL, NULL, 0                           \
    }

/* Registers a call target; ids are shared with tap targets and never 0.
 * Errors as for hcb_runtime_register_tap. */
HCB_API int hcb_runtime_register_call(hcb_runtime *rt,
                                      const hcb_call_target *target,
                                      uint64_t *id, hcb_error *err);

/* Runs call target `id` for `device` in the calling thread.  Taps that
 * `device` submitted earlier are delivered first, so that the host sees one
 * device's callbacks in the order the device issued them (skipped when the
 * caller is itself a consumer thread, which would wait for itself).  If
 * that takes longer than HCB_CALL_WAIT_WARN_NS, the runtime logs what the
 * call waits behind (see hcb_runtime_set_log) and goes on waiting: a
 * backlog, naming how many taps are not yet delivered, when taps were
 * delivered meanwhile (once a minute per device at most); else, when none
 * was, that a tap function that runs a computation containing this call on
 * another thread waits for itself.  The runtime's interrupt check can stop
 * that wait (hcb_runtime_set_interrupt): the call function then does not
 * run, and the call fails with HCB_ECALLBACK.
 * Errors: HCB_ENOTFOUND for an unknown id, HCB_EINVAL for the id of a tap
 * target, HCB_ECALLBACK for an interrupted wait, or the call function's
 * error (also recorded, see hcb_runtime_take_error). */
HCB_API int hcb_runtime_call(hcb_runtime *rt, uint64_t id, hcb_device device,
                             const hcb_array *args, size_t nargs,
                             const hcb_array *results, size_t nresults,
                             hcb_error *err);

/* How the devices of one computation share a call, or a tap delivered
 * now, under jit over operands sharded across devices: every device of the
 * computation runs the custom call on the whole operands, and one of them,
 * `runner`, runs the function -- once per call, as JAX runs a callback
 * there.  The others take a copy of its results, or fail with its error. */
typedef struct hcb_share {
    size_t struct_size;
    hcb_device runner; /* the device that runs the function */
    /* The devices of this process that make each call, the runner
     * included (all of the computation's: it has no device elsewhere). */
    int64_t participants;
    /* What the calls of one execution share: XLA's run id (hcb_ffi_run_id),
     * or 0 where there is none. */
    int64_t launch;
    /* Nonzero: every participant passes the whole operands (and, for a tap
     * delivered now, a record of them made for `runner`), so the first to
     * come runs the function, as the runner (the device it is given is
     * `runner`) -- the devices of a step arrive one after the other on a
     * busy machine, and the runner need not be the first.  Zero: the
     * runner alone runs it, and the others need pass no operands. */
    int first_runs;
} hcb_share;

#define HCB_SHARE_INIT                                                         \
    {                                                                          \
        sizeof(hcb_share), 0, 1, 0, 0                                          \
    }

/* Makes call `id` of `device` as one of `share->participants` devices: the
 * runner (or, with `first_runs`, the first participant to come, for the
 * runner) runs it as hcb_runtime_call does and publishes a copy of its
 * results (or its error); each other participant waits for it and copies
 * those bytes into its own `results`, or fails with the runner's error
 * (recorded for the runner only).  The k-th call of `id` by each device in
 * one launch meet: every device makes the same calls, in the same order,
 * as they do in an SPMD program.  No lock is held while the function runs
 * or bytes are copied.  A participant that has waited HCB_CALL_WAIT_WARN_NS
 * for the runner says so (hcb_runtime_set_log) and goes on waiting.
 * Errors: those of hcb_runtime_call; HCB_EINVAL for a share with no
 * participant, or results whose sizes differ from the runner's; HCB_ESTATE
 * when more meetings are under way than the runtime holds (64). */
HCB_API int hcb_runtime_call_shared(hcb_runtime *rt, const hcb_share *share,
                                    uint64_t id, hcb_device device,
                                    const hcb_array *args, size_t nargs,
                                    const hcb_array *results, size_t nresults,
                                    hcb_error *err);

/* The same for a tap delivered now (hcb_runtime_deliver): the runner
 * passes its record and delivers it; the others pass NULL, wait until the
 * runner's tap function has returned, and return its outcome.  With
 * `first_runs` every participant passes a record for the runner's device:
 * the first to come delivers its own, the others' are released. */
HCB_API int hcb_runtime_deliver_shared(hcb_runtime *rt, const hcb_share *share,
                                       uint64_t id, hcb_device device,
                                       hcb_record *rec, int flags,
                                       hcb_error *err);

/* For a call that one device runs for `ndevices` devices whose
 * collectives then spread its results (JAX's Python callback under jit
 * over operands sharded across processes): like hcb_runtime_call, and a
 * failure is also parked for the "hcb_sharded_check" FFI handler (see
 * hcb/ffi_handlers.h), which raises it on every one of the devices, so
 * that none waits forever for the others (`ndevices`: this process's
 * devices of the computation, each of which takes it once).  Returns the
 * call's error code; `*parked` tells whether the failure was parked
 * (false: raise it now). */
HCB_API int hcb_runtime_call_parked(hcb_runtime *rt, uint64_t id,
                                    hcb_device device, const hcb_array *args,
                                    size_t nargs, const hcb_array *results,
                                    size_t nresults, int64_t ndevices,
                                    int *parked, hcb_error *err);

#define HCB_CALL_WAIT_WARN_NS ((uint64_t)2000000000u)

/* Receives the runtime's warnings: conditions a person should see that are
 * no error of one callback.  Without one they go to stderr.  Called from
 * any thread, with no lock held; `message` is borrowed. */
typedef void (*hcb_log_fn)(void *user, const char *message);

/* Sets (or with fn NULL, clears) the warning sink. */
HCB_API void hcb_runtime_set_log(hcb_runtime *rt, hcb_log_fn fn, void *user);

/* Queues `rec` for its device, waiting while the queue is over its bound
 * (back-pressure), and starts the device's consumer thread if needed.
 * Ownership of `rec` passes to the runtime whatever the result.  On error
 * (HCB_ENOMEM, HCB_ESYSTEM, or HCB_ECALLBACK when the runtime's interrupt
 * check stopped its wait: see hcb_runtime_set_interrupt) the record has not
 * been queued and is released, except in the one case documented in
 * docs/runtime.md (a consumer restart that failed after a stop) where it
 * waits in the queue for the next start. */
HCB_API int hcb_runtime_submit(hcb_runtime *rt, hcb_record *rec,
                               hcb_error *err);

/* Returns once every record submitted for `device` (or for every device,
 * with HCB_ALL_DEVICES) before the call has been consumed.  HCB_EDEADLK if
 * called from the consumer thread it would wait for. */
HCB_API int hcb_runtime_barrier(hcb_runtime *rt, hcb_device device,
                                hcb_error *err);

/* A check that a waiting thread calls to ask whether to stop waiting: for
 * an embedder that must react while something waits (Python's Ctrl-C).
 * A wait calls it as it begins to wait, with `*wait_state` 0, and then
 * every poll interval while it waits, with `*wait_state` as the check left
 * it (the check's own, kept for one wait); in the waiting thread, with no
 * lock of the runtime held.  `device` is the device the wait is for.
 * Returns nonzero to stop the wait; may then write its reason into `err`
 * (never NULL), which the wait's error message ends with.  The one
 * signature of hcb_runtime_set_interrupt (every wait of a device's thread)
 * and hcb_runtime_barrier_poll (one barrier). */
typedef int (*hcb_check_fn)(void *user, hcb_device device, uint64_t *wait_state,
                            hcb_error *err);

/* Like hcb_runtime_barrier, and it calls `check(user, device, &state, err)`
 * as it begins to wait for a device and every `poll_ns` while it waits
 * (see hcb_check_fn): when that returns nonzero the barrier stops waiting
 * and returns HCB_ECALLBACK ("barrier on cpu:0 interrupted ...", with the
 * check's reason).  The records it waited for are still delivered.  For a
 * caller that must react while it waits (Python's Ctrl-C in
 * barrier_wait).  With `check` NULL it is hcb_runtime_barrier; else
 * HCB_EINVAL for a zero `poll_ns`. */
HCB_API int hcb_runtime_barrier_poll(hcb_runtime *rt, hcb_device device,
                                     uint64_t poll_ns, hcb_check_fn check,
                                     void *user, hcb_error *err);

/* What hcb_runtime_deliver does with a failure of the tap function. */
#define HCB_DELIVER_FAIL 0 /* returns it: the caller's computation fails */
/* records it (hcb_runtime_take_error), as a queued tap's failure is, and
 * returns HCB_OK: the caller goes on */
#define HCB_DELIVER_KEEP_ERROR 1

/* Delivers `rec` now, in the calling thread: runs its tap target here, as
 * JAX runs its debug callbacks inside the computation, once the records
 * its device submitted before have been delivered (the wait, its warnings
 * and its interrupt check are hcb_runtime_call's; none when nothing is
 * pending, the common case: two atomic loads, no other thread woken).  For
 * a tap whose computation's results must be ready only once it has run,
 * and whose failure is that computation's (the "hcb_tap" FFI handler with
 * attribute deliver, hcb/ffi_handlers.h).  A consumer thread does not wait
 * (it would wait for itself: a tap function running a computation of its
 * device in its own thread).  `flags` is HCB_DELIVER_FAIL or
 * HCB_DELIVER_KEEP_ERROR.  Ownership of `rec` passes to the runtime
 * whatever the result; it is released once its function has returned (a
 * tap function that keeps it retains it).  The delivery is counted in the
 * device's statistics as a record in and out.  Errors: HCB_EINVAL (rec
 * NULL, or the id of a call target), HCB_ENOTFOUND (an unknown id),
 * HCB_ENOMEM (the device's channel), HCB_ECALLBACK for an interrupted
 * wait (the function does not run), or the tap function's error (also
 * recorded, see hcb_runtime_take_error). */
HCB_API int hcb_runtime_deliver(hcb_runtime *rt, hcb_record *rec, int flags,
                                hcb_error *err);

/* Sets (or with `check` NULL, clears) the runtime's interrupt check: the
 * one check of every wait of a device's thread, each of which calls it as
 * it begins to wait and every `poll_ns` while it waits (see hcb_check_fn),
 * in the waiting thread (XLA's, or whichever called the runtime):
 *   - hcb_runtime_submit waiting for room in a full queue ("tap of N bytes
 *     on cpu:0 interrupted while waiting for room in its queue ..."): the
 *     record is released, never queued;
 *   - a GPU tap reserving its room in the queue on XLA's thread (the same
 *     wait and message; what submits the record never waits);
 *   - hcb_runtime_call waiting for the taps its device issued before it
 *     ("call 'f' on cpu:0 interrupted while waiting for the N taps its
 *     device issued before it"): the call function does not run;
 *   - hcb_runtime_deliver waiting for the same ("tap 'f' on cpu:0
 *     interrupted while waiting ..."): the tap function does not run;
 *   - a GPU device waiting for room in its pinned pool ("CUDA device 0
 *     interrupted while waiting for room in its pinned pool").
 * A wait it stops fails with HCB_ECALLBACK, the message ending with the
 * check's reason; what was queued before is still delivered, and the
 * runtime works on.  The check may run on any thread, at any time: it
 * must be quick, must not wait for the runtime, and must not call it.
 * Thread-safe; a wait already begun keeps the check it began with, so
 * `user` (borrowed) must outlive every wait begun while it was set.
 * HCB_EINVAL for a zero `poll_ns` with a check. */
HCB_API int hcb_runtime_set_interrupt(hcb_runtime *rt, uint64_t poll_ns,
                                      hcb_check_fn check, void *user,
                                      hcb_error *err);

/* Drains every queue and joins every consumer thread.  The runtime stays
 * usable: the next submit starts the device's thread again.  HCB_EDEADLK if
 * called from a consumer thread. */
HCB_API int hcb_runtime_stop(hcb_runtime *rt, hcb_error *err);

/* Whether the calling thread is a runtime's consumer thread, running the
 * tap functions of queued records: there a barrier, a stop, or a wait for
 * its own device would wait for itself (they refuse, HCB_EDEADLK, or skip
 * the wait).  A record delivered now (hcb_runtime_deliver) runs in the
 * thread that delivers it, which is not one.  Any thread. */
HCB_API bool hcb_in_consumer_thread(void);

/* Statistics of one device, or of all devices summed (HCB_ALL_DEVICES). */
typedef struct hcb_stats {
    size_t struct_size;
    uint64_t records_in;  /* records submitted */
    uint64_t bytes_in;    /* their sizes */
    uint64_t records_out; /* records consumed (tap function returned) */
    uint64_t bytes_out;
    uint64_t queued_records;   /* submitted, not yet consumed */
    uint64_t queued_bytes;     /* their sizes */
    uint64_t high_water_bytes; /* the most bytes held under the bound:
                                  queued and reserved (max over devices) */
    uint64_t producer_waits;   /* submits that had to wait for space */
    uint64_t producer_wait_ns; /* total time they waited */
    uint64_t errors;           /* tap functions that failed, unknown ids */
    uint64_t devices;          /* devices with a queue */
    /* Room taken in the queue for records on their way, not yet submitted
     * (a GPU tap whose copy has not landed): not in queued_* nor in
     * records_in/bytes_in until submitted. */
    uint64_t reserved_records;
    uint64_t reserved_bytes;
} hcb_stats;

#define HCB_STATS_INIT                                                         \
    {                                                                          \
        sizeof(hcb_stats), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0               \
    }

/* Fills `stats` (its struct_size set by the caller).  HCB_ENOTFOUND for a
 * device that never had a record. */
HCB_API int hcb_runtime_stats(hcb_runtime *rt, hcb_device device,
                              hcb_stats *stats, hcb_error *err);

/* The devices that have a queue: writes up to `cap` keys to `out` and
 * returns how many exist. */
HCB_API size_t hcb_runtime_devices(hcb_runtime *rt, hcb_device *out,
                                   size_t cap);

/* Returns the number of errors recorded since the last call and, if there
 * were any and `last` is not NULL, copies the last one into it; then forgets
 * them.  The counters in hcb_stats are not reset. */
HCB_API uint64_t hcb_runtime_take_error(hcb_runtime *rt, hcb_error *last);

/* Records an error as a failed tap would (for embedders that detect errors
 * outside a tap function). */
HCB_API void hcb_runtime_record_error(hcb_runtime *rt, hcb_device device,
                                      const hcb_error *error);

/* ------------------------------------------------------------------------ */
/* Printing: numpy.array2string and id_print's layout                       */

/* The largest `precision` the printer takes. */
#define HCB_PRINT_MAX_PRECISION 400

/* How floats are printed (numpy's `floatmode`). */
typedef enum hcb_floatmode {
    HCB_FLOATMODE_MAXPREC = 0,      /* shortest digits, at most `precision` */
    HCB_FLOATMODE_FIXED = 1,        /* exactly `precision` digits */
    HCB_FLOATMODE_UNIQUE = 2,       /* shortest digits, `precision` ignored */
    HCB_FLOATMODE_MAXPREC_EQUAL = 3 /* maxprec, same count for all */
} hcb_floatmode;

/* numpy's print options (numpy.get_printoptions()), with numpy's defaults
 * in HCB_PRINT_OPTIONS_INIT.  `width` is the line width of id_print's
 * layout of containers (JAX's pretty printer, 80). */
typedef struct hcb_print_options {
    size_t struct_size;
    int64_t threshold; /* summarise arrays of more elements (1000) */
    int32_t edgeitems; /* elements kept at each end when summarised (3) */
    int32_t linewidth; /* characters per line (75) */
    int32_t precision; /* float digits after the point,
                          0..HCB_PRINT_MAX_PRECISION (8) */
    hcb_floatmode floatmode;
    char sign;       /* '-', '+' or ' ' for positive values ('-') */
    int suppress;    /* non-zero: never scientific for small values */
    char nanstr[16]; /* "nan" */
    char infstr[16]; /* "inf" */
    int32_t width;   /* id_print's container layout width (80) */
} hcb_print_options;

#define HCB_PRINT_OPTIONS_INIT                                                 \
    {                                                                          \
        sizeof(hcb_print_options), 1000, 3, 75, 8, HCB_FLOATMODE_MAXPREC, '-', \
            0, "nan", "inf", 80                                                \
    }

/* Whether hcb_format_array and hcb_format_value print arrays of `dtype`
 * (true for bool, the integers, float16/32/64, complex64/128, bfloat16 and
 * the sub-byte types); for any other (the float8 types) they return
 * HCB_EUNIMPL.  The one answer to which dtypes the printer prints: Python's
 * id_print asks it (through register_print) before it registers a C
 * printing target.  Thread-safe. */
HCB_API bool hcb_print_supports(hcb_dtype dtype);

/* Formats one array as numpy.array2string(a) does with these options (NULL:
 * the defaults) and the installed numpy 2.x: bool, integers, float16/32/64,
 * complex64/128 digit for digit (shortest round-trip digits, numpy's choice
 * of positional or scientific notation, alignment, nan/inf, summarisation,
 * line wrapping), and bfloat16 as ml_dtypes prints it; other types (the
 * float8 types) are HCB_EUNIMPL.
 *
 * Like snprintf: writes at most `cap` bytes including a terminating NUL
 * (nothing if `cap` is 0) and sets `*len` (may be NULL) to the length of
 * the whole text; the text was cut if *len >= cap.  Reentrant; no locks,
 * no allocation beyond a few small buffers.  Errors: HCB_EINVAL (malformed
 * view or options), HCB_EUNIMPL (a dtype it cannot print), HCB_ENOMEM. */
HCB_API int hcb_format_array(const hcb_array *a, const hcb_print_options *opts,
                             char *buf, size_t cap, size_t *len,
                             hcb_error *err);

/* id_print's layout of a value: a tree of containers over arrays, given in
 * preorder.  A container node is followed by its `count` children (each a
 * whole subtree); an array node takes the next array of the list. */
typedef enum hcb_print_kind {
    HCB_PRINT_ARRAY = 0,  /* the next array, as hcb_format_array prints it */
    HCB_PRINT_TEXT = 1,   /* `text` as is */
    HCB_PRINT_TUPLE = 2,  /* ( a b ) */
    HCB_PRINT_LIST = 3,   /* [ a b ] */
    HCB_PRINT_DICT = 4,   /* { k=a l=b }: children carry their `key` */
    HCB_PRINT_CONCAT = 5, /* ab: the children's texts one after the other,
                             nothing between or around them */
    HCB_PRINT_STR = 6,    /* the next array as numpy's str() prints it:
                             hcb_format_array's text for rank >= 1, the
                             scalar's str() (print options ignored) for
                             rank 0, e.g. "0.1", "1e+16", "(1+2j)" */
    HCB_PRINT_FIELD = 7   /* the next array as a plain "{}" field of Python's
                             str.format prints it (format(a, "")): as STR
                             for rank >= 1; for rank 0 the str() of the
                             Python bool, int, float or complex numpy makes
                             of it, e.g. float32 0.1: "0.10000000149011612" */
} hcb_print_kind;

/* The strings are (pointer, length in bytes) and may hold any bytes, NUL
 * included: they are copied into the text as they are.  Borrowed for the
 * call.  UTF-8 text is measured in characters (the bytes that do not
 * continue a character) when a container decides whether it fits on one
 * line. */
typedef struct hcb_print_node {
    hcb_print_kind kind;
    int32_t count;   /* containers: number of children */
    const char *key; /* a child of a DICT: its key, printed "key="; else NULL */
    size_t key_len;
    const char *text; /* TEXT: the text; else NULL */
    size_t text_len;
} hcb_print_node;

/* Formats a value the way id_print does (and debug.print, with CONCAT, TEXT,
 * STR and FIELD nodes): containers as "( a b )", "[ a b ]"
 * and "{ k=a }", on one line when they fit in `opts->width` columns, else
 * one child per line indented by two per level (JAX's pretty printer), with
 * arrays as hcb_format_array prints them.  `nodes` must describe exactly
 * one tree that uses exactly `narrays` arrays; it may nest as deep as it
 * has nodes (it is walked without recursion).  Output and errors as
 * hcb_format_array, except that the text holds the nodes' keys and texts
 * byte for byte, NUL bytes included: `*len` is its length. */
HCB_API int hcb_format_value(const hcb_print_node *nodes, size_t nnodes,
                             const hcb_array *arrays, size_t narrays,
                             const hcb_print_options *opts, char *buf,
                             size_t cap, size_t *len, hcb_error *err);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HCB_HCB_H */
