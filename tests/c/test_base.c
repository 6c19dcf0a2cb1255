/* test_base.c - version, errors, dtypes, the allocation hook. */
#include "testutil.h"

static void
test_version(void **state)
{
    (void)state;
    assert_int_equal(hcb_version(), HCB_VERSION_NUMBER);
    assert_string_equal(hcb_version_string(), "0.1.0");
}

static void
test_error_set_formats_and_truncates(void **state)
{
    hcb_error err;
    char big[HCB_ERROR_MESSAGE_SIZE + 100];

    (void)state;
    assert_int_equal(hcb_error_set(&err, HCB_EINVAL, "bad %s %d", "x", 3),
                     HCB_EINVAL);
    assert_int_equal(err.code, HCB_EINVAL);
    assert_string_equal(err.message, "bad x 3");
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    hcb_error_set(&err, HCB_EINTERNAL, "%s", big);
    assert_int_equal(strlen(err.message), HCB_ERROR_MESSAGE_SIZE - 1);
    /* NULL err is allowed and still returns the code. */
    assert_int_equal(hcb_error_set(NULL, HCB_ENOMEM, "x"), HCB_ENOMEM);
}

static void
test_strerror_covers_codes(void **state)
{
    int c;

    (void)state;
    for (c = HCB_OK; c >= HCB_ESYSTEM; c--)
        assert_string_not_equal(hcb_strerror(c), "unknown error code");
    assert_string_equal(hcb_strerror(-100), "unknown error code");
}

static void
test_dtypes(void **state)
{
    (void)state;
    assert_int_equal(hcb_dtype_size(HCB_BOOL), 1);
    assert_int_equal(hcb_dtype_size(HCB_BF16), 2);
    assert_int_equal(hcb_dtype_size(HCB_F32), 4);
    assert_int_equal(hcb_dtype_size(HCB_C64), 8);
    assert_int_equal(hcb_dtype_size(HCB_C128), 16);
    assert_int_equal(hcb_dtype_size(HCB_TOKEN), 0);
    assert_int_equal(hcb_dtype_size((hcb_dtype)21), 0); /* S4: sub-byte */
    assert_string_equal(hcb_dtype_name(HCB_BF16), "bfloat16");
    assert_string_equal(hcb_dtype_name(HCB_U64), "uint64");
    assert_string_equal(hcb_dtype_name((hcb_dtype)99), "invalid");
}

static void
test_sub_byte_dtypes(void **state)
{
    /* int4 [1, -2, 7, -8, 3]: ml_dtypes keeps the 4 bits, high bits zero */
    const uint8_t s4[5] = {0x1, 0xe, 0x7, 0x8, 0x3};
    /* uint2 [1, 2, 3, 0, 1, 3] */
    const uint8_t u2[6] = {1, 2, 3, 0, 1, 3};
    uint8_t packed[4], back[8];

    (void)state;
    assert_int_equal(hcb_dtype_bits(HCB_S2), 2);
    assert_int_equal(hcb_dtype_bits(HCB_U2), 2);
    assert_int_equal(hcb_dtype_bits(HCB_S4), 4);
    assert_int_equal(hcb_dtype_bits(HCB_U4), 4);
    assert_int_equal(hcb_dtype_bits(HCB_F4E2M1FN), 4);
    assert_int_equal(hcb_dtype_bits(HCB_BF16), 16);
    assert_int_equal(hcb_dtype_bits(HCB_C128), 128);
    assert_int_equal(hcb_dtype_bits(HCB_TOKEN), 0);
    assert_int_equal(hcb_dtype_bits((hcb_dtype)30), 0); /* S1: unsupported */
    assert_int_equal(hcb_dtype_size(HCB_S4), 0);
    assert_string_equal(hcb_dtype_name(HCB_S2), "int2");
    assert_string_equal(hcb_dtype_name(HCB_U4), "uint4");
    assert_string_equal(hcb_dtype_name(HCB_F4E2M1FN), "float4_e2m1fn");

    assert_int_equal(hcb_dtype_nbytes(HCB_S4, 0), 0);
    assert_int_equal(hcb_dtype_nbytes(HCB_S4, 5), 3);
    assert_int_equal(hcb_dtype_nbytes(HCB_U2, 5), 2);
    assert_int_equal(hcb_dtype_nbytes(HCB_U2, 8), 2);
    assert_int_equal(hcb_dtype_nbytes(HCB_U2, SIZE_MAX), SIZE_MAX / 4 + 1);
    assert_int_equal(hcb_dtype_nbytes(HCB_F32, 3), 12);
    assert_true(hcb_dtype_nbytes(HCB_F32, SIZE_MAX / 2) == SIZE_MAX);
    assert_true(hcb_dtype_nbytes(HCB_TOKEN, 1) == SIZE_MAX);

    /* XLA's layout: element 0 in the low bits; padding bits zero */
    memset(packed, 0xff, sizeof packed);
    hcb_pack_elements(HCB_S4, s4, 5, packed);
    assert_int_equal(packed[0], 0xe1);
    assert_int_equal(packed[1], 0x87);
    assert_int_equal(packed[2], 0x03);
    assert_int_equal(packed[3], 0xff); /* past the 3 bytes: untouched */
    memset(back, 0xff, sizeof back);
    hcb_unpack_elements(HCB_S4, packed, 5, back);
    assert_memory_equal(back, s4, 5);
    assert_int_equal(back[5], 0xff);

    hcb_pack_elements(HCB_U2, u2, 6, packed);
    assert_int_equal(packed[0], 0x39); /* 1 | 2 << 2 | 3 << 4 | 0 << 6 */
    assert_int_equal(packed[1], 0x0d); /* 1 | 3 << 2 */
    hcb_unpack_elements(HCB_U2, packed, 6, back);
    assert_memory_equal(back, u2, 6);

    /* high bits of numpy's bytes are ignored when packing */
    back[0] = 0xf1;
    hcb_pack_elements(HCB_U4, back, 1, packed);
    assert_int_equal(packed[0], 0x01);

    /* other types copy */
    hcb_pack_elements(HCB_S8, s4, 4, packed);
    assert_memory_equal(packed, s4, 4);
    hcb_unpack_elements(HCB_S8, packed, 4, back);
    assert_memory_equal(back, s4, 4);
}

static void
test_allocator_hook_sees_every_allocation(void **state)
{
    hcb_runtime *rt = NULL;
    long before;

    (void)state;
    tu_install_allocator();
    before = atomic_load(&tu_live_allocs);
    assert_int_equal(hcb_runtime_create(NULL, &rt, NULL), HCB_OK);
    assert_true(atomic_load(&tu_live_allocs) > before);
    hcb_runtime_destroy(rt);
    assert_int_equal(atomic_load(&tu_live_allocs), before);
    hcb_set_allocator(NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_error_set_formats_and_truncates),
        cmocka_unit_test(test_strerror_covers_codes),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_sub_byte_dtypes),
        cmocka_unit_test(test_allocator_hook_sees_every_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
