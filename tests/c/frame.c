/* frame.c - see frame.h. */
#include "frame.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

int32_t test_device_ordinal = 0;
_Thread_local int32_t test_thread_ordinal = -1;
_Thread_local void *test_thread_stream = NULL;
int64_t test_run_id = 0;
_Thread_local int64_t test_thread_run_id = -1;

static XLA_FFI_Error *
fake_error_create(XLA_FFI_Error_Create_Args *args)
{
    test_error *e = calloc(1, sizeof *e);

    e->code = args->errc;
    snprintf(e->message, sizeof e->message, "%s", args->message);
    return (XLA_FFI_Error *)e;
}

static void
fake_error_destroy(XLA_FFI_Error_Destroy_Args *args)
{
    free(args->error);
}

static XLA_FFI_Error *
fake_device_ordinal(XLA_FFI_DeviceOrdinal_Get_Args *args)
{
    args->device_ordinal =
        test_thread_ordinal >= 0 ? test_thread_ordinal : test_device_ordinal;
    return NULL;
}

static XLA_FFI_Error *
fake_run_id(XLA_FFI_RunId_Get_Args *args)
{
    args->run_id = test_thread_run_id >= 0 ? test_thread_run_id : test_run_id;
    return NULL;
}

/* As XLA does, it checks that the arguments are whole for the header's
 * version (0.4 added `errc`). */
static void
fake_error_get_message(hcb_ffi_error_message_args *args)
{
#if XLA_FFI_API_MAJOR == 0 && XLA_FFI_API_MINOR < 4
    size_t whole = XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE;
#else
    size_t whole = XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE;
#endif

    if (args->struct_size < whole) {
        args->message = "(struct_size too small for this FFI version)";
        return;
    }
    args->message = ((test_error *)args->error)->message;
}

void *test_stream = NULL;

static XLA_FFI_Error *
fake_stream_get(XLA_FFI_Stream_Get_Args *args)
{
    XLA_FFI_Error_Create_Args e = {XLA_FFI_Error_Create_Args_STRUCT_SIZE, NULL,
                                   "no GPU context here",
                                   XLA_FFI_Error_Code_UNIMPLEMENTED};

    if (test_thread_stream != NULL) {
        args->stream = test_thread_stream;
        return NULL;
    }
    if (test_stream == NULL)
        return fake_error_create(&e);
    args->stream = test_stream;
    return NULL;
}

static XLA_FFI_Api fake_api;
static pthread_once_t fake_api_once = PTHREAD_ONCE_INIT;

static void
fake_api_init(void)
{
    fake_api.struct_size = sizeof fake_api;
    fake_api.api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    fake_api.api_version.major_version = XLA_FFI_API_MAJOR;
    fake_api.api_version.minor_version = XLA_FFI_API_MINOR;
    fake_api.XLA_FFI_Error_Create = fake_error_create;
    fake_api.XLA_FFI_Error_Destroy = fake_error_destroy;
    fake_api.XLA_FFI_DeviceOrdinal_Get = fake_device_ordinal;
    fake_api.XLA_FFI_RunId_Get = fake_run_id;
    fake_api.HCB_FFI_API_ERROR_MESSAGE = fake_error_get_message;
    fake_api.XLA_FFI_Stream_Get = fake_stream_get;
}

/* Frames are made by the threads that play devices too: the API once. */
void
tf_init(test_frame *tf)
{
    memset(tf, 0, sizeof *tf);
    pthread_once(&fake_api_once, fake_api_init);
    tf->frame.struct_size = sizeof tf->frame;
    tf->frame.api = &fake_api;
    tf->frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
    tf->frame.args.types = tf->arg_types;
    tf->frame.args.args = tf->arg_ptrs;
    tf->frame.rets.types = tf->ret_types;
    tf->frame.rets.rets = tf->ret_ptrs;
    tf->frame.attrs.types = tf->attr_types;
    tf->frame.attrs.names = tf->name_ptrs;
    tf->frame.attrs.attrs = tf->attr_ptrs;
}

void
tf_add_arg(test_frame *tf, XLA_FFI_DataType dtype, void *data, int64_t rank,
           int64_t *dims)
{
    int64_t i = tf->frame.args.size++;

    tf->args[i] = (XLA_FFI_Buffer){
        XLA_FFI_Buffer_STRUCT_SIZE, NULL, dtype, data, rank, dims};
    tf->arg_ptrs[i] = &tf->args[i];
    tf->arg_types[i] = XLA_FFI_ArgType_BUFFER;
}

void
tf_add_ret(test_frame *tf, XLA_FFI_DataType dtype, void *data, int64_t rank,
           int64_t *dims)
{
    int64_t i = tf->frame.rets.size++;

    tf->rets[i] = (XLA_FFI_Buffer){
        XLA_FFI_Buffer_STRUCT_SIZE, NULL, dtype, data, rank, dims};
    tf->ret_ptrs[i] = &tf->rets[i];
    tf->ret_types[i] = XLA_FFI_RetType_BUFFER;
}

void
tf_add_buffer(test_frame *tf, XLA_FFI_DataType dtype, void *data, int64_t rank,
              int64_t *dims, void *ret_data)
{
    tf_add_arg(tf, dtype, data, rank, dims);
    tf_add_ret(tf, dtype, ret_data != NULL ? ret_data : data, rank, dims);
}

void
tf_add_attr(test_frame *tf, const char *name, XLA_FFI_AttrType type,
            void *value)
{
    int64_t i = tf->frame.attrs.size++;

    tf->names[i] = (XLA_FFI_ByteSpan){name, strlen(name)};
    tf->name_ptrs[i] = &tf->names[i];
    tf->attr_types[i] = type;
    tf->attr_ptrs[i] = value;
}

static void
add_scalar(test_frame *tf, const char *name, XLA_FFI_DataType dtype,
           void *value)
{
    int64_t i = tf->frame.attrs.size;

    tf->scalars[i] = (XLA_FFI_Scalar){dtype, value};
    tf_add_attr(tf, name, XLA_FFI_AttrType_SCALAR, &tf->scalars[i]);
}

void
tf_add_u64(test_frame *tf, const char *name, uint64_t v)
{
    int64_t i = tf->frame.attrs.size;

    tf->u64_values[i] = v;
    add_scalar(tf, name, XLA_FFI_DataType_U64, &tf->u64_values[i]);
}

void
tf_add_i64(test_frame *tf, const char *name, int64_t v)
{
    int64_t i = tf->frame.attrs.size;

    tf->i64_values[i] = v;
    add_scalar(tf, name, XLA_FFI_DataType_S64, &tf->i64_values[i]);
}

int
tf_error_code(XLA_FFI_Error *e, char *msg, size_t cap)
{
    test_error *te = (test_error *)e;
    int code;

    if (te == NULL) {
        if (msg != NULL && cap > 0)
            msg[0] = '\0';
        return 0;
    }
    code = (int)te->code;
    if (msg != NULL)
        snprintf(msg, cap, "%s", te->message);
    free(te);
    return code;
}

int
tf_probe_as(XLA_FFI_Handler *handler, int api_minor, hcb_ffi_metadata *md)
{
    XLA_FFI_Api api;
    XLA_FFI_Metadata_Extension ext;
    XLA_FFI_CallFrame frame;

    memset(&frame, 0, sizeof frame);
    md->struct_size = XLA_FFI_Metadata_STRUCT_SIZE;
    md->api_version.minor_version = -1;
    ext.extension_base.struct_size = XLA_FFI_Metadata_Extension_STRUCT_SIZE;
    ext.extension_base.type = XLA_FFI_Extension_Metadata;
    ext.extension_base.next = NULL;
    ext.metadata = (XLA_FFI_Metadata *)md;
    frame.struct_size = sizeof frame;
    frame.extension_start = &ext.extension_base;
    frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
    if (api_minor > 1) { /* FFI 0.1 gives the probe no API */
        pthread_once(&fake_api_once, fake_api_init);
        api = fake_api;
        api.api_version.minor_version = api_minor;
        frame.api = &api;
    }
    if (handler(&frame) != NULL)
        return -2;
    return md->api_version.major_version == 0 ? md->api_version.minor_version
                                              : -1;
}

int
tf_probe(XLA_FFI_Handler *handler)
{
    hcb_ffi_metadata md;

    memset(&md, 0, sizeof md);
    return tf_probe_as(handler, XLA_FFI_API_MINOR, &md);
}
