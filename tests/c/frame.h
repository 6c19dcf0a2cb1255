/*
 * frame.h - hand-built XLA FFI call frames for the handler tests, with a
 * minimal fake XLA_FFI_Api (errors, the device ordinal and the stream).
 */
#ifndef HCB_TEST_FRAME_H
#define HCB_TEST_FRAME_H

#include "hcb/ffi.h"

#define TF_MAX 24

typedef struct test_frame {
    XLA_FFI_CallFrame frame;
    XLA_FFI_Buffer args[TF_MAX], rets[TF_MAX];
    void *arg_ptrs[TF_MAX], *ret_ptrs[TF_MAX];
    XLA_FFI_ArgType arg_types[TF_MAX];
    XLA_FFI_RetType ret_types[TF_MAX];
    XLA_FFI_ByteSpan names[TF_MAX];
    XLA_FFI_ByteSpan *name_ptrs[TF_MAX];
    XLA_FFI_AttrType attr_types[TF_MAX];
    XLA_FFI_Scalar scalars[TF_MAX];
    void *attr_ptrs[TF_MAX];
    uint64_t u64_values[TF_MAX];
    int64_t i64_values[TF_MAX];
} test_frame;

/* The fake API: errors are heap objects holding code and message. */
typedef struct test_error {
    XLA_FFI_Error_Code code;
    char message[HCB_ERROR_MESSAGE_SIZE];
} test_error;

extern int32_t test_device_ordinal; /* what DeviceOrdinal_Get reports */
extern void *test_stream; /* what Stream_Get reports; NULL: it fails */
/* The same for the calling thread alone (a thread that plays another
 * device), in place of the two above: -1 and NULL leave them. */
extern _Thread_local int32_t test_thread_ordinal;
extern _Thread_local void *test_thread_stream;
/* What RunId_Get reports (the launch), and the same for the calling
 * thread alone (-1 leaves it). */
extern int64_t test_run_id;
extern _Thread_local int64_t test_thread_run_id;

void tf_init(test_frame *tf);
/* Adds an operand/result pair; the result aliases the operand unless
 * `ret_data` is given. */
void tf_add_buffer(test_frame *tf, XLA_FFI_DataType dtype, void *data,
                   int64_t rank, int64_t *dims, void *ret_data);
/* Adds an operand, or a result, alone (call frames do not alias). */
void tf_add_arg(test_frame *tf, XLA_FFI_DataType dtype, void *data,
                int64_t rank, int64_t *dims);
void tf_add_ret(test_frame *tf, XLA_FFI_DataType dtype, void *data,
                int64_t rank, int64_t *dims);
/* Attributes must be added in sorted name order, as XLA sorts them. */
void tf_add_u64(test_frame *tf, const char *name, uint64_t v);
void tf_add_i64(test_frame *tf, const char *name, int64_t v);
/* Any attribute: `value` (borrowed) is what XLA would point at for `type`
 * (XLA_FFI_Scalar, XLA_FFI_Array, XLA_FFI_ByteSpan or XLA_FFI_Attrs). */
void tf_add_attr(test_frame *tf, const char *name, XLA_FFI_AttrType type,
                 void *value);

/* Reads and frees an error a handler returned (NULL: success -> 0). */
int tf_error_code(XLA_FFI_Error *e, char *msg, size_t cap);

/* Runs the metadata probe on `handler`, as XLA of the header built against
 * does, and returns the minor version it reported (or -1 if it did not
 * answer): TF_PROBE_MINOR. */
int tf_probe(XLA_FFI_Handler *handler);
#define TF_PROBE_MINOR                                                         \
    (XLA_FFI_API_MINOR < HCB_FFI_API_MINOR ? XLA_FFI_API_MINOR                 \
                                           : HCB_FFI_API_MINOR)
/* The same as the XLA of FFI API 0.`api_minor` does (0.1 passes no API),
 * filling `md`. */
int tf_probe_as(XLA_FFI_Handler *handler, int api_minor, hcb_ffi_metadata *md);

#endif
