/*
 * test_ffi_sdk.c - the C SDK for FFI handlers (include/hcb/ffi.h) on
 * hand-built call frames: typed operands and results, attributes of every
 * kind, the device and stream, the handler wrapper, and the FFI API version
 * spoken with each XLA (ffi_version.h).
 */
#include "testutil.h"

#include <stddef.h>

#include "frame.h"

static char msg[HCB_ERROR_MESSAGE_SIZE];

/* ---- operands and results ----------------------------------------------- */

static void
test_typed_operands_and_results(void **state)
{
    float x[6] = {0};
    int32_t y = 0;
    int64_t dims[2] = {2, 3};
    test_frame tf;
    hcb_array a;
    hcb_error err;

    (void)state;
    tf_init(&tf);
    tf_add_arg(&tf, XLA_FFI_DataType_F32, x, 2, dims);
    tf_add_ret(&tf, XLA_FFI_DataType_S32, &y, 0, NULL);

    assert_int_equal(hcb_ffi_check_counts(&tf.frame, 1, 1, &err), HCB_OK);
    assert_int_equal(hcb_ffi_check_counts(&tf.frame, -1, 2, &err), HCB_EINVAL);
    assert_string_equal(err.message, "expected 2 results, got 1");

    assert_int_equal(hcb_ffi_arg(&tf.frame, 0, HCB_F32, 2, &a, &err), HCB_OK);
    assert_ptr_equal(a.data, x);
    assert_int_equal(a.nbytes, sizeof x);
    assert_int_equal(a.dims[1], 3);
    assert_int_equal(
        hcb_ffi_arg(&tf.frame, 0, HCB_ANY_DTYPE, HCB_ANY_RANK, &a, &err),
        HCB_OK);
    assert_int_equal(hcb_ffi_arg(&tf.frame, 0, HCB_S32, 2, &a, &err),
                     HCB_EINVAL);
    assert_string_equal(err.message,
                        "operand 0 has dtype float32, expected int32");
    assert_int_equal(hcb_ffi_arg(&tf.frame, 0, HCB_F32, 1, &a, &err),
                     HCB_EINVAL);
    assert_string_equal(err.message, "operand 0 has rank 2, expected 1");
    assert_int_equal(hcb_ffi_arg(&tf.frame, 1, HCB_F32, 1, &a, &err),
                     HCB_EINVAL);
    assert_string_equal(err.message,
                        "operand 1 does not exist: the call has 1 operands");

    assert_int_equal(hcb_ffi_result(&tf.frame, 0, HCB_S32, 0, &a, &err),
                     HCB_OK);
    assert_ptr_equal(a.data, &y);
    assert_int_equal(hcb_ffi_result(&tf.frame, 0, HCB_BOOL, 0, &a, &err),
                     HCB_EINVAL);
    assert_string_equal(err.message, "result 0 has dtype int32, expected bool");

    /* A token has no bytes to view; a non-buffer is refused; NULL err. */
    tf.args[0].dtype = XLA_FFI_DataType_TOKEN;
    assert_int_equal(
        hcb_ffi_arg(&tf.frame, 0, HCB_ANY_DTYPE, HCB_ANY_RANK, &a, &err),
        HCB_EUNIMPL);
    assert_non_null(strstr(err.message, "operand 0: unsupported buffer type"));
    tf.arg_types[0] = XLA_FFI_ArgType_BUFFER + 1;
    assert_int_equal(
        hcb_ffi_arg(&tf.frame, 0, HCB_ANY_DTYPE, HCB_ANY_RANK, &a, NULL),
        HCB_EINVAL);
}

/* Sub-byte types are packed in XLA's buffers: nbytes counts packed bytes. */
static void
test_sub_byte_buffers_are_packed(void **state)
{
    uint8_t data[4] = {0};
    int64_t d7[1] = {7}, d2x3[2] = {2, 3};
    test_frame tf;
    hcb_array a;
    hcb_error err;

    (void)state;
    tf_init(&tf);
    tf_add_arg(&tf, XLA_FFI_DataType_S4, data, 1, d7);
    tf_add_arg(&tf, XLA_FFI_DataType_U2, data, 2, d2x3);
    tf_add_arg(&tf, XLA_FFI_DataType_F4E2M1FN, data, 0, NULL);
    tf_add_ret(&tf, XLA_FFI_DataType_U4, data, 1, d7);
    assert_int_equal(hcb_ffi_arg(&tf.frame, 0, HCB_S4, 1, &a, &err), HCB_OK);
    assert_int_equal(a.dtype, HCB_S4);
    assert_int_equal(a.nbytes, 4);
    assert_int_equal(hcb_ffi_arg(&tf.frame, 1, HCB_U2, 2, &a, &err), HCB_OK);
    assert_int_equal(a.nbytes, 2);
    assert_int_equal(hcb_ffi_arg(&tf.frame, 2, HCB_F4E2M1FN, 0, &a, &err),
                     HCB_OK);
    assert_int_equal(a.nbytes, 1);
    assert_int_equal(hcb_ffi_result(&tf.frame, 0, HCB_U4, 1, &a, &err), HCB_OK);
    assert_int_equal(a.nbytes, 4);
    /* 1-bit types have no layout jaxlib accepts: still unsupported */
    tf.args[0].dtype = XLA_FFI_DataType_S1;
    assert_int_equal(
        hcb_ffi_arg(&tf.frame, 0, HCB_ANY_DTYPE, HCB_ANY_RANK, &a, &err),
        HCB_EUNIMPL);
    assert_string_equal(err.message, "operand 0: unsupported buffer type "
                                     "invalid (XLA type 30)");
}

/* ---- attributes ---------------------------------------------------------- */

/* A frame with one attribute of every kind, sorted by name. */
typedef struct attr_frame {
    test_frame tf;
    bool b;
    int8_t i8;
    int32_t i32;
    int64_t i64;
    uint8_t u8;
    uint64_t u64, big;
    float f32;
    double f64;
    int64_t arr_i64[3];
    double arr_f64[2];
    XLA_FFI_Scalar s_b, s_i8, s_i32, s_i64, s_u8, s_u64, s_big, s_f32, s_f64,
        s_inner;
    XLA_FFI_Array a_i64, a_f64;
    XLA_FFI_ByteSpan str;
    /* the dictionary {"inner": int64 7, "name": "x"} */
    XLA_FFI_Attrs dict;
    XLA_FFI_ByteSpan dict_names[2], *dict_name_ptrs[2];
    XLA_FFI_AttrType dict_types[2];
    void *dict_values[2];
    int64_t inner;
    XLA_FFI_ByteSpan inner_str;
} attr_frame;

static void
attr_frame_init(attr_frame *f)
{
    memset(f, 0, sizeof *f);
    tf_init(&f->tf);
    f->b = true;
    f->i8 = -8;
    f->i32 = -32;
    f->i64 = -64;
    f->u8 = 8;
    f->u64 = 64;
    f->big = UINT64_MAX;
    f->f32 = 1.5f;
    f->f64 = 2.25;
    f->arr_i64[0] = 1, f->arr_i64[1] = 2, f->arr_i64[2] = 3;
    f->arr_f64[0] = 0.5, f->arr_f64[1] = -0.5;
    f->inner = 7;
#define SCALAR(field, dt) f->s_##field = (XLA_FFI_Scalar){dt, &f->field}
    SCALAR(b, XLA_FFI_DataType_PRED);
    SCALAR(i8, XLA_FFI_DataType_S8);
    SCALAR(i32, XLA_FFI_DataType_S32);
    SCALAR(i64, XLA_FFI_DataType_S64);
    SCALAR(u8, XLA_FFI_DataType_U8);
    SCALAR(u64, XLA_FFI_DataType_U64);
    SCALAR(big, XLA_FFI_DataType_U64);
    SCALAR(f32, XLA_FFI_DataType_F32);
    SCALAR(f64, XLA_FFI_DataType_F64);
    SCALAR(inner, XLA_FFI_DataType_S64);
#undef SCALAR
    f->a_i64 = (XLA_FFI_Array){XLA_FFI_DataType_S64, 3, f->arr_i64};
    f->a_f64 = (XLA_FFI_Array){XLA_FFI_DataType_F64, 2, f->arr_f64};
    f->str = (XLA_FFI_ByteSpan){"hello world", 5}; /* not NUL-terminated */
    f->inner_str = (XLA_FFI_ByteSpan){"x", 1};

    f->dict_names[0] = (XLA_FFI_ByteSpan){"inner", 5};
    f->dict_names[1] = (XLA_FFI_ByteSpan){"name", 4};
    f->dict_name_ptrs[0] = &f->dict_names[0];
    f->dict_name_ptrs[1] = &f->dict_names[1];
    f->dict_types[0] = XLA_FFI_AttrType_SCALAR;
    f->dict_types[1] = XLA_FFI_AttrType_STRING;
    f->dict_values[0] = &f->s_inner;
    f->dict_values[1] = &f->inner_str;
    f->dict = (XLA_FFI_Attrs){
        XLA_FFI_Attrs_STRUCT_SIZE, NULL,          2, f->dict_types,
        f->dict_name_ptrs,         f->dict_values};

    tf_add_attr(&f->tf, "a_f64", XLA_FFI_AttrType_ARRAY, &f->a_f64);
    tf_add_attr(&f->tf, "a_i64", XLA_FFI_AttrType_ARRAY, &f->a_i64);
    tf_add_attr(&f->tf, "b", XLA_FFI_AttrType_SCALAR, &f->s_b);
    tf_add_attr(&f->tf, "big", XLA_FFI_AttrType_SCALAR, &f->s_big);
    tf_add_attr(&f->tf, "d", XLA_FFI_AttrType_DICTIONARY, &f->dict);
    tf_add_attr(&f->tf, "f32", XLA_FFI_AttrType_SCALAR, &f->s_f32);
    tf_add_attr(&f->tf, "f64", XLA_FFI_AttrType_SCALAR, &f->s_f64);
    tf_add_attr(&f->tf, "i32", XLA_FFI_AttrType_SCALAR, &f->s_i32);
    tf_add_attr(&f->tf, "i64", XLA_FFI_AttrType_SCALAR, &f->s_i64);
    tf_add_attr(&f->tf, "i8", XLA_FFI_AttrType_SCALAR, &f->s_i8);
    tf_add_attr(&f->tf, "s", XLA_FFI_AttrType_STRING, &f->str);
    tf_add_attr(&f->tf, "u64", XLA_FFI_AttrType_SCALAR, &f->s_u64);
    tf_add_attr(&f->tf, "u8", XLA_FFI_AttrType_SCALAR, &f->s_u8);
}

static void
test_attributes_of_every_kind(void **state)
{
    static attr_frame f;
    const XLA_FFI_Attrs *attrs = &f.tf.frame.attrs, *dict = NULL;
    bool b = false;
    int8_t i8 = 0;
    int32_t i32 = 0;
    int64_t i64 = 0;
    uint8_t u8 = 0;
    uint64_t u64 = 0;
    float f32 = 0;
    double f64 = 0;
    const int64_t *ai = NULL;
    const double *ad = NULL;
    const char *p = NULL;
    size_t n = 0;
    char buf[8];
    hcb_error err;

    (void)state;
    attr_frame_init(&f);
    assert_int_equal(hcb_ffi_attr_bool(attrs, "b", &b, &err), HCB_OK);
    assert_true(b);
    assert_int_equal(hcb_ffi_attr_i8(attrs, "i8", &i8, &err), HCB_OK);
    assert_int_equal(i8, -8);
    assert_int_equal(hcb_ffi_attr_i32(attrs, "i32", &i32, &err), HCB_OK);
    assert_int_equal(i32, -32);
    assert_int_equal(hcb_ffi_attr_i64(attrs, "i64", &i64, &err), HCB_OK);
    assert_int_equal(i64, -64);
    assert_int_equal(hcb_ffi_attr_u8(attrs, "u8", &u8, &err), HCB_OK);
    assert_int_equal(u8, 8);
    assert_int_equal(hcb_ffi_attr_u64(attrs, "u64", &u64, &err), HCB_OK);
    assert_int_equal(u64, 64);
    assert_int_equal(hcb_ffi_attr_f32(attrs, "f32", &f32, &err), HCB_OK);
    assert_true(f32 == 1.5f);
    assert_int_equal(hcb_ffi_attr_f64(attrs, "f64", &f64, &err), HCB_OK);
    assert_true(f64 == 2.25);

    /* Any integer width through hcb_ffi_attr_int, within int64. */
    assert_int_equal(hcb_ffi_attr_int(attrs, "i8", &i64, &err), HCB_OK);
    assert_int_equal(i64, -8);
    assert_int_equal(hcb_ffi_attr_int(attrs, "u8", &i64, &err), HCB_OK);
    assert_int_equal(i64, 8);
    assert_int_equal(hcb_ffi_attr_int(attrs, "big", &i64, &err), HCB_EINVAL);
    assert_string_equal(err.message, "attribute 'big' is 18446744073709551615, "
                                     "which does not fit an int64");
    assert_int_equal(hcb_ffi_attr_int(attrs, "f32", &i64, &err), HCB_EINVAL);
    assert_string_equal(err.message,
                        "attribute 'f32' is a float32 scalar, expected an "
                        "integer");

    /* Strings: a span, or a NUL-terminated copy that must fit. */
    assert_int_equal(hcb_ffi_attr_string(attrs, "s", &p, &n, &err), HCB_OK);
    assert_int_equal(n, 5);
    assert_memory_equal(p, "hello", 5);
    assert_int_equal(
        hcb_ffi_attr_string_copy(attrs, "s", buf, sizeof buf, &err), HCB_OK);
    assert_string_equal(buf, "hello");
    assert_int_equal(hcb_ffi_attr_string_copy(attrs, "s", buf, 5, &err),
                     HCB_EINVAL);
    assert_string_equal(err.message, "attribute 's' is a string of 5 bytes, "
                                     "expected at most 4");

    /* Arrays. */
    assert_int_equal(hcb_ffi_attr_array_i64(attrs, "a_i64", &ai, &n, &err),
                     HCB_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ai[2], 3);
    assert_int_equal(hcb_ffi_attr_array_f64(attrs, "a_f64", &ad, &n, &err),
                     HCB_OK);
    assert_true(n == 2 && ad[1] == -0.5);
    assert_int_equal(hcb_ffi_attr_array_f64(attrs, "a_i64", &ad, &n, &err),
                     HCB_EINVAL);
    assert_string_equal(err.message, "attribute 'a_i64' is an int64 array, "
                                     "expected a float64 array");

    /* Dictionaries: the same functions on the nested list. */
    assert_int_equal(hcb_ffi_attr_dict(attrs, "d", &dict, &err), HCB_OK);
    assert_int_equal(hcb_ffi_attr_i64(dict, "inner", &i64, &err), HCB_OK);
    assert_int_equal(i64, 7);
    assert_int_equal(hcb_ffi_attr_string(dict, "name", &p, &n, &err), HCB_OK);
    assert_true(n == 1 && p[0] == 'x');
    assert_int_equal(hcb_ffi_attr_i64(dict, "i64", &i64, &err), HCB_ENOTFOUND);

    /* Kind and type mismatches say what came and what was expected. */
    assert_int_equal(hcb_ffi_attr_i32(attrs, "i64", &i32, &err), HCB_EINVAL);
    assert_string_equal(err.message, "attribute 'i64' is an int64 scalar, "
                                     "expected an int32 scalar");
    assert_int_equal(hcb_ffi_attr_f64(attrs, "s", &f64, &err), HCB_EINVAL);
    assert_string_equal(err.message,
                        "attribute 's' is a string, expected a float64 "
                        "scalar");
    assert_int_equal(hcb_ffi_attr_string(attrs, "d", &p, &n, &err), HCB_EINVAL);
    assert_string_equal(err.message,
                        "attribute 'd' is a dictionary, expected a string");
    assert_int_equal(hcb_ffi_attr_dict(attrs, "a_i64", &dict, &err),
                     HCB_EINVAL);
    assert_string_equal(err.message, "attribute 'a_i64' is an int64 array, "
                                     "expected a dictionary");
    assert_int_equal(hcb_ffi_attr_u64(attrs, "nope", &u64, &err),
                     HCB_ENOTFOUND);
    assert_string_equal(err.message, "missing attribute 'nope'");
    /* Every name is found by the binary search, none that is absent. */
    assert_non_null(hcb_ffi_attr_find(attrs, "a_f64", NULL));
    assert_non_null(hcb_ffi_attr_find(attrs, "u8", NULL));
    assert_null(hcb_ffi_attr_find(attrs, "i", NULL));
    assert_null(hcb_ffi_attr_find(attrs, "zz", NULL));
}

/* ---- context ------------------------------------------------------------ */

static void
test_device_and_stream(void **state)
{
    int token = 0;
    int32_t ordinal = -1;
    void *stream = NULL;
    test_frame tf;
    hcb_error err;

    (void)state;
    tf_init(&tf);
    test_device_ordinal = 3;
    assert_int_equal(hcb_ffi_device_ordinal(&tf.frame, &ordinal, &err), HCB_OK);
    assert_int_equal(ordinal, 3);
    test_device_ordinal = 0;

    /* CPU: XLA refuses, and the SDK says why (the fake's message). */
    test_stream = NULL;
    assert_int_equal(hcb_ffi_stream(&tf.frame, &stream, &err), HCB_EUNIMPL);
    assert_string_equal(err.message,
                        "no stream for this call: no GPU context here");
    test_stream = &token;
    assert_int_equal(hcb_ffi_stream(&tf.frame, &stream, &err), HCB_OK);
    assert_ptr_equal(stream, &token);
    test_stream = NULL;
}

/* ---- the handler wrapper ------------------------------------------------ */

static int
sum_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    hcb_array x, out;
    const float *in;
    double scale = 1.0;
    float total = 0;
    size_t i;
    int rc;

    if ((rc = hcb_ffi_arg(frame, 0, HCB_F32, 1, &x, err)) != HCB_OK ||
        (rc = hcb_ffi_result(frame, 0, HCB_F32, 0, &out, err)) != HCB_OK)
        return rc;
    rc = hcb_ffi_attr_f64(&frame->attrs, "scale", &scale, err);
    if (rc != HCB_OK && rc != HCB_ENOTFOUND) /* optional, default 1 */
        return rc;
    in = (const float *)x.data;
    for (i = 0; i < (size_t)x.dims[0]; i++)
        total += in[i];
    *(float *)out.data = (float)(total * scale);
    return HCB_OK;
}

static int
forgetful_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    (void)frame, (void)err;
    return 42; /* fails without saying why */
}

HCB_FFI_HANDLER(test_sum, sum_body, 0)
HCB_FFI_HANDLER(test_forgetful, forgetful_body,
                XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE)

static void
test_handler_wrapper(void **state)
{
    float x[3] = {1, 2, 3}, out = 0;
    int64_t dims[1] = {3};
    double scale = 2.0;
    XLA_FFI_Scalar s = {XLA_FFI_DataType_F64, &scale};
    test_frame tf;

    (void)state;
    assert_int_equal(tf_probe(test_sum), TF_PROBE_MINOR);
    assert_int_equal(tf_probe(test_forgetful), TF_PROBE_MINOR);

    tf_init(&tf);
    tf_add_arg(&tf, XLA_FFI_DataType_F32, x, 1, dims);
    tf_add_ret(&tf, XLA_FFI_DataType_F32, &out, 0, NULL);
    assert_int_equal(tf_error_code(test_sum(&tf.frame), msg, sizeof msg), 0);
    assert_true(out == 6.0f);
    tf_add_attr(&tf, "scale", XLA_FFI_AttrType_SCALAR, &s);
    assert_int_equal(tf_error_code(test_sum(&tf.frame), msg, sizeof msg), 0);
    assert_true(out == 12.0f);

    /* A body's error, prefixed with the handler's name. */
    tf.args[0].dtype = XLA_FFI_DataType_S32;
    assert_int_equal(tf_error_code(test_sum(&tf.frame), msg, sizeof msg),
                     XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_string_equal(
        msg, "test_sum: operand 0 has dtype int32, expected float32");

    /* The stage is checked before the body runs. */
    tf.frame.stage = XLA_FFI_ExecutionStage_PREPARE;
    assert_int_equal(tf_error_code(test_sum(&tf.frame), msg, sizeof msg),
                     XLA_FFI_Error_Code_INVALID_ARGUMENT);
    assert_string_equal(msg,
                        "handler 'test_sum' called at stage 1, expected 3");

    /* A body that fails without filling err still fails, saying so. */
    tf_init(&tf);
    assert_int_equal(tf_error_code(test_forgetful(&tf.frame), msg, sizeof msg),
                     XLA_FFI_Error_Code_UNKNOWN);
    assert_string_equal(msg, "test_forgetful: failed with code 42");
}

/* ---- the FFI API version of the XLA that calls ------------------------- */

static XLA_FFI_TypeId test_state_type = {42};
static int test_state_value;

static void
test_state_free(void *state)
{
    (void)state;
}

/* A stateful handler: its INSTANTIATE stage sets a state. */
static XLA_FFI_Error *
test_stateful(XLA_FFI_CallFrame *frame)
{
    if (hcb_ffi_answer_probe_stateful(frame, 0, &test_state_type))
        return NULL;
    return hcb_ffi_state_set(frame, &test_state_type, &test_state_value,
                             test_state_free);
}

/* What the fake XLA_FFI_State_Set read, in the layout of FFI 0.`layout`. */
static struct {
    int layout;
    size_t struct_size;
    XLA_FFI_ExecutionStage stage;
    XLA_FFI_TypeId *type_id;
    void *state;
    void (*deleter)(void *);
} set_seen;

static XLA_FFI_Error *
fake_state_set(XLA_FFI_State_Set_Args *args)
{
    const char *raw = (const char *)args;
    size_t at = 3 * sizeof(void *); /* past struct_size, extension, ctx */

    set_seen.struct_size = args->struct_size;
    if (set_seen.layout >= 3) { /* 0.3 put the stage after the context */
        memcpy(&set_seen.stage, raw + at, sizeof set_seen.stage);
        at += sizeof(void *);
    }
    memcpy(&set_seen.type_id, raw + at, sizeof set_seen.type_id);
    memcpy(&set_seen.state, raw + at + sizeof(void *), sizeof set_seen.state);
    if (set_seen.layout == 1) /* 0.1 took the deleter with each state */
        memcpy(&set_seen.deleter, raw + at + 2 * sizeof(void *),
               sizeof set_seen.deleter);
    /* The header built against reads its own layout the same way. */
    if (set_seen.layout == XLA_FFI_API_MINOR) {
        assert_ptr_equal(args->type_id, set_seen.type_id);
        assert_ptr_equal(args->state, set_seen.state);
    }
    return NULL;
}

static void
test_speaks_the_callers_ffi_version(void **state)
{
    /* XLA's own version, up to 0.3: JAX 0.6/0.7 (0.1) accept only 0.1, 0.8
     * (0.2) at most 0.2, 0.11 and 0.12 (0.4, 0.5) accept 0.3. */
    static const struct {
        int api_minor, spoken;
        size_t whole; /* XLA_FFI_State_Set_Args_STRUCT_SIZE of that version */
    } cases[] = {
        {1, 1, 6 * sizeof(void *)},
        {2, 2, 5 * sizeof(void *)},
        {3, 3, 6 * sizeof(void *)},
        {5, 3, 6 * sizeof(void *)},
    };
    hcb_ffi_metadata md;
    size_t i;

    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        test_frame tf;
        XLA_FFI_Api api;

        memset(&md, 0xab, sizeof md);
        assert_int_equal(tf_probe_as(test_stateful, cases[i].api_minor, &md),
                         cases[i].spoken);
        assert_int_equal(tf_probe_as(test_sum, cases[i].api_minor, &md),
                         cases[i].spoken);
        if (cases[i].spoken == 1) {
            /* 0.1's metadata ends at the traits: nothing written past. */
            const unsigned char *past =
                (const unsigned char *)&md.state_type_id;

            assert_int_equal(past[0], 0xab);
            assert_int_equal(past[sizeof md.state_type_id - 1], 0xab);
        } else {
            assert_int_equal(
                tf_probe_as(test_stateful, cases[i].api_minor, &md),
                cases[i].spoken);
            assert_int_equal(md.state_type_id.type_id, 42);
            tf_probe_as(test_sum, cases[i].api_minor, &md);
            assert_int_equal(md.state_type_id.type_id, 0); /* stateless */
        }

        /* The state, in the layout of the version spoken. */
        tf_init(&tf);
        api = *tf.frame.api;
        api.api_version.minor_version = cases[i].api_minor;
        api.XLA_FFI_State_Set = fake_state_set;
        tf.frame.api = &api;
        tf.frame.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
        memset(&set_seen, 0, sizeof set_seen);
        set_seen.layout = cases[i].spoken;
        set_seen.stage = XLA_FFI_ExecutionStage_EXECUTE;
        assert_null(test_stateful(&tf.frame));
        assert_true(set_seen.struct_size >= cases[i].whole);
        assert_ptr_equal(set_seen.type_id, &test_state_type);
        assert_ptr_equal(set_seen.state, &test_state_value);
        if (cases[i].spoken == 1)
            assert_true(set_seen.deleter == test_state_free);
        if (cases[i].spoken >= 3)
            assert_int_equal(set_seen.stage,
                             XLA_FFI_ExecutionStage_INSTANTIATE);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_typed_operands_and_results),
        cmocka_unit_test(test_sub_byte_buffers_are_packed),
        cmocka_unit_test(test_attributes_of_every_kind),
        cmocka_unit_test(test_device_and_stream),
        cmocka_unit_test(test_handler_wrapper),
        cmocka_unit_test(test_speaks_the_callers_ffi_version),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
