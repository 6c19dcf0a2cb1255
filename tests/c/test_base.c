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
        cmocka_unit_test(test_allocator_hook_sees_every_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
