/*
 * test_print_value.c - hcb_format_value against JAX's pretty printer (the
 * layout of id_print's values) and numpy's str() (debug.print's fields),
 * its snprintf contract and its errors (print_check.h says where the
 * expected texts come from).
 */
#include "print_check.h"

static void
test_value_snprintf_contract(void **state)
{
    const hcb_print_node nodes[2] = {{HCB_PRINT_TUPLE, 1, S(NULL), S(NULL)},
                                     {HCB_PRINT_TEXT, 0, S(NULL), S("abc")}};
    char buf[4];
    size_t len = 0;

    (void)state;
    /* T(pp.text('abc')) */
    assert_int_equal(
        hcb_format_value(nodes, 2, NULL, 0, NULL, NULL, 0, &len, NULL), HCB_OK);
    assert_int_equal(len, strlen("( abc )"));
    assert_int_equal(
        hcb_format_value(nodes, 2, NULL, 0, NULL, buf, sizeof buf, &len, NULL),
        HCB_OK);
    assert_string_equal(buf, "( a");
    assert_int_equal(len, strlen("( abc )"));
}

static void
test_value_errors(void **state)
{
    const int32_t v[1] = {7};
    const int64_t d1[1] = {1};
    const hcb_array arrays[2] = {view(HCB_S32, 1, d1, v),
                                 view(HCB_S32, 1, d1, v)};
    const hcb_array f8 = view(HCB_F8E4M3FN, 1, d1, v);
    const hcb_print_node two_arrays[3] = {
        {HCB_PRINT_TUPLE, 2, S(NULL), S(NULL)},
        {HCB_PRINT_ARRAY, 0, S(NULL), S(NULL)},
        {HCB_PRINT_ARRAY, 0, S(NULL), S(NULL)}};
    const hcb_print_node open_tuple[2] = {
        {HCB_PRINT_TUPLE, 3, S(NULL), S(NULL)},
        {HCB_PRINT_ARRAY, 0, S(NULL), S(NULL)}};
    const hcb_print_node keyless[3] = {{HCB_PRINT_DICT, 2, S(NULL), S(NULL)},
                                       {HCB_PRINT_ARRAY, 0, S("a"), S(NULL)},
                                       {HCB_PRINT_ARRAY, 0, S(NULL), S(NULL)}};
    const hcb_print_node extra[2] = {{HCB_PRINT_ARRAY, 0, S(NULL), S(NULL)},
                                     {HCB_PRINT_TEXT, 0, S(NULL), S("x")}};
    const hcb_print_node no_text[1] = {{HCB_PRINT_TEXT, 0, S(NULL), S(NULL)}};
    const hcb_print_node bad_kind[1] = {
        {(hcb_print_kind)9, 0, S(NULL), S(NULL)}};
    const hcb_print_node neg_count[1] = {
        {HCB_PRINT_LIST, -1, S(NULL), S(NULL)}};
    const hcb_print_node one_array[1] = {
        {HCB_PRINT_ARRAY, 0, S(NULL), S(NULL)}};
    hcb_print_options bad = HCB_PRINT_OPTIONS_INIT;
    hcb_error err;
    char buf[64];

    (void)state;
    expect_error(hcb_format_value(two_arrays, 3, arrays, 1, NULL, buf,
                                  sizeof buf, NULL, &err),
                 &err, HCB_EINVAL, "more than the 1 arrays");
    expect_error(hcb_format_value(one_array, 1, arrays, 2, NULL, buf,
                                  sizeof buf, NULL, &err),
                 &err, HCB_EINVAL, "use 1 arrays, but 2 were given");
    expect_error(hcb_format_value(open_tuple, 2, arrays, 1, NULL, buf,
                                  sizeof buf, NULL, &err),
                 &err, HCB_EINVAL, "end inside a container");
    expect_error(hcb_format_value(keyless, 3, arrays, 2, NULL, buf, sizeof buf,
                                  NULL, &err),
                 &err, HCB_EINVAL, "node 2 is in a dict but has no key");
    expect_error(hcb_format_value(extra, 2, arrays, 1, NULL, buf, sizeof buf,
                                  NULL, &err),
                 &err, HCB_EINVAL, "a tree of 1 nodes, but 2 were given");
    expect_error(hcb_format_value(one_array, 0, arrays, 1, NULL, buf,
                                  sizeof buf, NULL, &err),
                 &err, HCB_EINVAL, "no print nodes");
    expect_error(hcb_format_value(no_text, 1, NULL, 0, NULL, buf, sizeof buf,
                                  NULL, &err),
                 &err, HCB_EINVAL, "text but has none");
    expect_error(hcb_format_value(bad_kind, 1, NULL, 0, NULL, buf, sizeof buf,
                                  NULL, &err),
                 &err, HCB_EINVAL, "kind 9");
    expect_error(hcb_format_value(neg_count, 1, NULL, 0, NULL, buf, sizeof buf,
                                  NULL, &err),
                 &err, HCB_EINVAL, "-1 children");
    expect_error(
        hcb_format_value(NULL, 1, NULL, 0, NULL, buf, sizeof buf, NULL, &err),
        &err, HCB_EINVAL, "NULL");
    /* an array's own error comes through */
    expect_error(hcb_format_value(one_array, 1, &f8, 1, NULL, buf, sizeof buf,
                                  NULL, &err),
                 &err, HCB_EUNIMPL, "float8_e4m3fn");
    bad.sign = 'x';
    expect_error(hcb_format_value(one_array, 1, arrays, 1, &bad, buf,
                                  sizeof buf, NULL, &err),
                 &err, HCB_EINVAL, "sign is 'x'");
}

/* Any nesting is printed: the tree is walked with a stack of its own, not
 * by recursion (a nesting of 100,000 would exhaust a thread's stack), and
 * a wrong tree inside it is still found. */
static void
test_value_deep_nesting(void **state)
{
    enum { DEPTH = 100000 };
    hcb_print_node *deep = calloc(DEPTH + 1, sizeof *deep);
    char *buf = malloc(4 * DEPTH + 2), *want = malloc(4 * DEPTH + 2);
    size_t len = 0, i;
    hcb_error err;

    (void)state;
    assert_non_null(deep);
    assert_non_null(buf);
    assert_non_null(want);
    for (i = 0; i < DEPTH; i++)
        deep[i] = (hcb_print_node){i % 2 ? HCB_PRINT_LIST : HCB_PRINT_TUPLE, 1,
                                   S(NULL), S(NULL)};
    deep[DEPTH] = (hcb_print_node){HCB_PRINT_TEXT, 0, S(NULL), S("x")};
    for (i = 0; i < DEPTH; i++)
        memcpy(want + 2 * i, i % 2 ? "[ " : "( ", 2);
    want[2 * DEPTH] = 'x';
    for (i = 0; i < DEPTH; i++)
        memcpy(want + 2 * DEPTH + 1 + 2 * i, (DEPTH - 1 - i) % 2 ? " ]" : " )",
               2);
    want[4 * DEPTH + 1] = '\0';
    assert_int_equal(hcb_format_value(deep, DEPTH + 1, NULL, 0, NULL, buf,
                                      4 * DEPTH + 2, &len, &err),
                     HCB_OK);
    assert_int_equal(len, 4 * DEPTH + 1);
    assert_string_equal(buf, want);
    /* the innermost node in a dict without its key */
    deep[DEPTH - 1].kind = HCB_PRINT_DICT;
    expect_error(
        hcb_format_value(deep, DEPTH + 1, NULL, 0, NULL, buf, 16, NULL, &err),
        &err, HCB_EINVAL, "node 100000 is in a dict but has no key");
    /* or one node short */
    deep[DEPTH - 1].kind = HCB_PRINT_TUPLE;
    expect_error(
        hcb_format_value(deep, DEPTH, NULL, 0, NULL, buf, 16, NULL, &err), &err,
        HCB_EINVAL, "end inside a container");
    free(deep);
    free(buf);
    free(want);
}

/* Keys and texts are (pointer, length): a NUL byte goes through like any
 * other, and UTF-8 text is measured in characters when a container decides
 * whether it fits on one line. */
static void
test_value_texts_are_any_bytes(void **state)
{
    /* 20 characters, 40 bytes each */
    static const char e20[] = "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
                              "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
                              "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
                              "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9";
    const hcb_print_node concat[3] = {{HCB_PRINT_CONCAT, 2, NULL, 0, NULL, 0},
                                      {HCB_PRINT_TEXT, 0, NULL, 0, "a\0b ", 4},
                                      {HCB_PRINT_TEXT, 0, NULL, 0, "c\0", 2}};
    const hcb_print_node dict[5] = {
        {HCB_PRINT_DICT, 2, NULL, 0, NULL, 0},
        {HCB_PRINT_TEXT, 0, "k\0", 2, "vvvvvvvvvv", 10},
        {HCB_PRINT_DICT, 2, e20, 40, NULL, 0},
        {HCB_PRINT_TEXT, 0, e20, 40, "x", 1},
        {HCB_PRINT_TEXT, 0, e20, 40, "y", 1}};
    char buf[256], want[256];
    size_t len = 0, n;

    (void)state;
    assert_int_equal(
        hcb_format_value(concat, 3, NULL, 0, NULL, buf, sizeof buf, &len, NULL),
        HCB_OK);
    assert_int_equal(len, 6);
    assert_memory_equal(buf, "a\0b c\0", 7); /* and the terminating NUL */
    /* the inner dict is 2 + 22 + 1 + 22 + 2 = 49 characters (89 bytes):
     * on one line from column 23; the outer one, 88 characters, is not */
    n = (size_t)snprintf(want, sizeof want,
                         "{ k%c=vvvvvvvvvv\n  %s={ %s=x %s=y } }", 0, e20, e20,
                         e20);
    assert_int_equal(
        hcb_format_value(dict, 5, NULL, 0, NULL, buf, sizeof buf, &len, NULL),
        HCB_OK);
    assert_int_equal(len, n);
    assert_memory_equal(buf, want, n);
}

static void
test_value_flat(void **state)
{
    const int64_t i3[3] = {1, 2, 3}, i2[2] = {1, 2};
    const double x = 2.5;
    const uint8_t yes = 1;
    const int64_t d3[1] = {3}, d2[1] = {2};
    const hcb_array arrays[3] = {view(HCB_S64, 1, d3, i3),
                                 view(HCB_F64, 0, NULL, &x),
                                 view(HCB_S64, 1, d2, i2)};
    const hcb_array flag = view(HCB_BOOL, 0, NULL, &yes);
    const hcb_array nested_arrays[2] = {arrays[2], flag};
    const hcb_print_node tuple[4] = {
        NODE(TUPLE, 3, NULL, NULL), NODE(ARRAY, 0, NULL, NULL),
        NODE(TEXT, 0, NULL, "hello"), NODE(ARRAY, 0, NULL, NULL)};
    const hcb_print_node nested[7] = {
        NODE(LIST, 2, NULL, NULL), NODE(DICT, 2, NULL, NULL),
        NODE(ARRAY, 0, "a", NULL), NODE(TUPLE, 2, "b", NULL),
        NODE(TEXT, 0, NULL, "x"),  NODE(TEXT, 0, NULL, "y"),
        NODE(ARRAY, 0, NULL, NULL)};
    const hcb_print_node empties[4] = {
        NODE(TUPLE, 3, NULL, NULL), NODE(TUPLE, 0, NULL, NULL),
        NODE(LIST, 0, NULL, NULL), NODE(DICT, 0, NULL, NULL)};
    const hcb_print_node lone_array[1] = {NODE(ARRAY, 0, NULL, NULL)};
    const hcb_print_node lone_text[1] = {NODE(TEXT, 0, NULL, "just text")};
    const hcb_print_node empty_text[1] = {NODE(TEXT, 0, NULL, "")};

    (void)state;
    /* T(A(np.array([1, 2, 3])), pp.text('hello'), A(np.array(2.5))) */
    check_value(tuple, 4, arrays, 2, NULL, "( [1 2 3] hello 2.5 )");
    /* L(D(a=A(np.array([1, 2])), b=T(pp.text('x'), pp.text('y'))),
     *   A(np.array(True))) */
    check_value(nested, 7, nested_arrays, 2, NULL,
                "[ { a=[1 2] b=( x y ) } True ]");
    /* T(T(), L(), D()) */
    check_value(empties, 4, NULL, 0, NULL, "( (  ) [  ] {  } )");
    /* T() */
    check_value(empties + 1, 1, NULL, 0, NULL, "(  )");
    /* A(np.array([1, 2, 3])): a bare array is hcb_format_array's text */
    check_value(lone_array, 1, arrays, 1, NULL, "[1 2 3]");
    /* pp.text('just text') */
    check_value(lone_text, 1, NULL, 0, NULL, "just text");
    /* pp.text(''): no text at all (UBSan once saw NULL + 0 here) */
    check_value(empty_text, 1, NULL, 0, NULL, "");
}

static void
test_value_broken(void **state)
{
    double thirds[10];
    int64_t ints[20], cube[8];
    const int64_t one = 1, two = 2;
    const int64_t d10[1] = {10}, d12[1] = {12}, d20[1] = {20},
                  d222[3] = {2, 2, 2};
    hcb_array arrays[4];
    const hcb_print_node tuple[4] = {
        NODE(TUPLE, 3, NULL, NULL), NODE(ARRAY, 0, NULL, NULL),
        NODE(ARRAY, 0, NULL, NULL), NODE(TEXT, 0, NULL, "tail")};
    const hcb_print_node dict[7] = {
        NODE(DICT, 2, NULL, NULL),      NODE(LIST, 2, "first", NULL),
        NODE(ARRAY, 0, NULL, NULL),     NODE(ARRAY, 0, NULL, NULL),
        NODE(TUPLE, 2, "second", NULL), NODE(ARRAY, 0, NULL, NULL),
        NODE(ARRAY, 0, NULL, NULL)};
    const hcb_print_node multiline[3] = {NODE(TUPLE, 2, NULL, NULL),
                                         NODE(ARRAY, 0, NULL, NULL),
                                         NODE(TEXT, 0, NULL, "z")};
    const hcb_print_node narrow[6] = {
        NODE(TUPLE, 3, NULL, NULL),  NODE(TEXT, 0, NULL, "abcdef"),
        NODE(LIST, 2, NULL, NULL),   NODE(TEXT, 0, NULL, "ghij"),
        NODE(TEXT, 0, NULL, "klmn"), NODE(TEXT, 0, NULL, "op")};
    hcb_print_options o = defaults();
    int i;

    (void)state;
    for (i = 0; i < 10; i++)
        thirds[i] = i / 3.0;
    for (i = 0; i < 20; i++)
        ints[i] = i;
    for (i = 0; i < 8; i++)
        cube[i] = i;

    /* T(A(np.arange(10.) / 3), A(np.arange(12)), pp.text('tail')): too wide,
     * so one child per line, indented by two; the array's own lines keep
     * numpy's indent */
    arrays[0] = view(HCB_F64, 1, d10, thirds);
    arrays[1] = view(HCB_S64, 1, d12, ints);
    check_value(tuple, 4, arrays, 2, NULL,
                "( [0.         0.33333333 0.66666667 1.         1.33333333 "
                "1.66666667\n"
                " 2.         2.33333333 2.66666667 3.        ]\n"
                "  [ 0  1  2  3  4  5  6  7  8  9 10 11]\n"
                "  tail )");

    /* D(first=L(A(np.arange(20)), A(np.arange(20))),
     *   second=T(A(np.array(1)), A(np.array(2)))): the outer dict and the
     * inner list break, the inner tuple fits on its line */
    arrays[0] = view(HCB_S64, 1, d20, ints);
    arrays[1] = view(HCB_S64, 1, d20, ints);
    arrays[2] = view(HCB_S64, 0, NULL, &one);
    arrays[3] = view(HCB_S64, 0, NULL, &two);
    check_value(dict, 7, arrays, 4, NULL,
                "{ first=[ [ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 "
                "16 17 18 19]\n"
                "    [ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 "
                "18 19] ]\n"
                "  second=( 1 2 ) }");

    /* T(A(np.arange(8).reshape(2, 2, 2)), pp.text('z')): JAX measures a
     * text by its length, newlines included, so this stays "flat" */
    arrays[0] = view(HCB_S64, 3, d222, cube);
    check_value(multiline, 3, arrays, 1, NULL,
                "( [[[0 1]\n  [2 3]]\n\n [[4 5]\n  [6 7]]] z )");

    /* T(pp.text('abcdef'), L(pp.text('ghij'), pp.text('klmn')),
     *   pp.text('op')).format(20, use_color=False) */
    o.width = 20;
    check_value(narrow, 6, NULL, 0, &o, "( abcdef\n  [ ghij klmn ]\n  op )");
}

/* debug.print's text: CONCAT joins literal text and the text of each
 * field with nothing between; STR is numpy's str(): the array's text for
 * rank >= 1, the scalar's str() for rank 0 (print options ignored); FIELD
 * is format(x, ""): for rank 0 the str() of the Python scalar. */
static void
test_concat_and_str(void **state)
{
    const int64_t i3[3] = {1, 2, 3}, d3[1] = {3};
    const double big = 1e20, tenth = 0.1, plain = 123456789.5;
    const float f32 = 1e6f, tenth32 = 0.1f;
    const uint16_t f16 = 0x63ce; /* 999 */
    const double c128[2] = {1.0, -2.5}, imag[2] = {0.0, 2.0};
    const double nan_im[2] = {1.0, NAN};
    const int32_t minus = -7;
    const uint8_t no = 0;
    const hcb_array arrays[2] = {view(HCB_S64, 1, d3, i3),
                                 view(HCB_F64, 0, NULL, &big)};
    /* "x={} y={}!" */
    const hcb_print_node fmt[5] = {
        NODE(CONCAT, 4, NULL, NULL), NODE(TEXT, 0, NULL, "x="),
        NODE(STR, 0, NULL, NULL), NODE(TEXT, 0, NULL, " y="),
        NODE(STR, 0, NULL, NULL)};
    const hcb_print_node lone[1] = {NODE(STR, 0, NULL, NULL)};
    const hcb_print_node field[1] = {NODE(FIELD, 0, NULL, NULL)};
    const hcb_print_node empty[1] = {NODE(CONCAT, 0, NULL, NULL)};
    const hcb_print_node in_tuple[4] = {
        NODE(TUPLE, 1, NULL, NULL), NODE(CONCAT, 2, NULL, NULL),
        NODE(TEXT, 0, NULL, "a"), NODE(TEXT, 0, NULL, "b")};
    hcb_print_options plus = defaults();
    hcb_array a;

    (void)state;
    plus.sign = '+';
    plus.precision = 2;
    check_value(fmt, 5, arrays, 2, NULL, "x=[1 2 3] y=1e+20");
    /* the options reach arrays, not scalars */
    check_value(fmt, 5, arrays, 2, &plus, "x=[+1 +2 +3] y=1e+20");
    check_value(empty, 1, NULL, 0, NULL, "");
    check_value(in_tuple, 4, NULL, 0, NULL, "( ab )");
    /* str(np.float64(0.1)), str(np.float64(123456789.5)) */
    a = view(HCB_F64, 0, NULL, &tenth);
    check_value(lone, 1, &a, 1, &plus, "0.1");
    a = view(HCB_F64, 0, NULL, &plain);
    check_value(lone, 1, &a, 1, NULL, "123456789.5");
    /* numpy 2 turns float32 scientific at 1e6, float16 at 1e3 */
    a = view(HCB_F32, 0, NULL, &f32);
    check_value(lone, 1, &a, 1, NULL, "1e+06");
    a = view(HCB_F16, 0, NULL, &f16);
    check_value(lone, 1, &a, 1, NULL, "999.0");
    /* complex: "(1-2.5j)", "2j", "(1+nanj)" */
    a = view(HCB_C128, 0, NULL, c128);
    check_value(lone, 1, &a, 1, NULL, "(1-2.5j)");
    a = view(HCB_C128, 0, NULL, imag);
    check_value(lone, 1, &a, 1, NULL, "2j");
    a = view(HCB_C128, 0, NULL, nan_im);
    check_value(lone, 1, &a, 1, NULL, "(1+nanj)");
    /* integers and bools ignore the sign option */
    a = view(HCB_S32, 0, NULL, &minus);
    check_value(lone, 1, &a, 1, &plus, "-7");
    a = view(HCB_BOOL, 0, NULL, &no);
    check_value(lone, 1, &a, 1, &plus, "False");
    /* FIELD: "{}".format(x), the Python scalar's str for 0-d */
    a = view(HCB_F32, 0, NULL, &tenth32);
    check_value(field, 1, &a, 1, NULL, "0.10000000149011612");
    check_value(lone, 1, &a, 1, NULL, "0.1");
    a = view(HCB_F32, 0, NULL, &f32);
    check_value(field, 1, &a, 1, NULL, "1000000.0");
    a = view(HCB_F16, 0, NULL, &f16);
    check_value(field, 1, &a, 1, NULL, "999.0");
    a = view(HCB_C128, 0, NULL, imag);
    check_value(field, 1, &a, 1, NULL, "2j");
    a = view(HCB_S32, 0, NULL, &minus);
    check_value(field, 1, &a, 1, &plus, "-7");
    check_value(field, 1, arrays, 1, &plus, "[+1 +2 +3]");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_value_snprintf_contract),
        cmocka_unit_test(test_value_errors),
        cmocka_unit_test(test_value_deep_nesting),
        cmocka_unit_test(test_value_texts_are_any_bytes),
        cmocka_unit_test(test_value_flat),
        cmocka_unit_test(test_value_broken),
        cmocka_unit_test(test_concat_and_str),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
