/*
 * fuzz_print.c - libFuzzer harness for hcb_format_array and hcb_format_value.
 *
 * The input is read front to back; missing bytes read as 0, so every input
 * means something and short inputs are cheap:
 *
 *   flags     bit 0: also print a value tree   bit 1: break the view's nbytes
 *             bit 2: NULL options (defaults)   bit 3: an out-of-memory round
 *             bit 4: dims NULL with rank > 0   bit 5: a bad struct_size
 *   dtype     index into `dtypes` (printable types, float8 types the
 *             printer rejects, then the packed sub-byte types); past the
 *             table: the raw byte as a code
 *   rank      % 5, then one byte per dim: % 8, or (b & 0x3f) if b & 0x80;
 *             the element count is then capped at MAX_ELEMS (halving dims)
 *   options   threshold, edgeitems, linewidth, precision, floatmode, sign,
 *             suppress, nanstr, infstr, width: each one byte picking from a
 *             table of odd and invalid values, or a raw value; the strings
 *             are a length byte and that many printable characters (length
 *             16: no NUL, which the printer must refuse)
 *   tree      (flag bit 0) node count, then three bytes per node: kind,
 *             count, and `extra`: the key (bits 0-1 pick one of 4, bit 2:
 *             NULL, bit 3: from the table of odd strings) and the text
 *             (bits 4-5, bit 6: NULL, bit 7: odd); the odd strings hold
 *             NUL bytes, UTF-8 and a lone surrogate as Python passes it
 *   oom       (flag bit 3) the index of the allocation to fail
 *   elements  the rest, zero-padded to the view's size
 *
 * Each call runs with capacities 0, 1, 7, 64 and 4096 (each buffer
 * allocated to exactly its size, so ASan sees any write past it) and once
 * with room for the whole text, and checks: every call gives the same code
 * and length; an error fills `err` with that code and a message; the text
 * is NUL-terminated within the capacity, is a prefix of the whole text and
 * has exactly the reported length; it holds only printable ASCII and
 * newlines (and, in a value's text, the bytes of the odd strings); and its
 * length is within max_array_text (below).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hcb/hcb.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Kept small so that each input runs fast; summarisation is still reached
 * through small thresholds. */
#define MAX_ELEMS 512
#define MAX_NODES 24

#define NELEMS(t) (sizeof(t) / sizeof((t)[0]))

/* Checks that stay on in release builds (assert() would vanish). */
#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                    \
            abort();                                                           \
        }                                                                      \
    } while (0)

/* ---- reading the input --------------------------------------------------- */

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static uint8_t
take(reader *r)
{
    if (r->n == 0)
        return 0;
    r->n--;
    return *r->p++;
}

static const hcb_dtype dtypes[] = {
    HCB_BOOL,   HCB_S8,       HCB_S16,           HCB_S32,        HCB_S64,
    HCB_U8,     HCB_U16,      HCB_U32,           HCB_U64,        HCB_F16,
    HCB_F32,    HCB_F64,      HCB_C64,           HCB_C128,       HCB_BF16,
    HCB_F8E5M2, HCB_F8E4M3FN, HCB_F8E4M3B11FNUZ, HCB_F8E5M2FNUZ, HCB_F8E4M3FNUZ,
    HCB_F8E4M3, HCB_F8E3M4,   HCB_F8E8M0FNU,     HCB_S2,         HCB_U2,
    HCB_S4,     HCB_U4,       HCB_F4E2M1FN};
#define NDTYPES NELEMS(dtypes)

/* Picks from `table` by b % (n + 1); the extra slot gives `raw`. */
#define PICK(table, b, raw)                                                    \
    ((b) % (NELEMS(table) + 1) < NELEMS(table)                                 \
         ? (table)[(b) % (NELEMS(table) + 1)]                                  \
         : (raw))

static const int64_t thresholds[] = {-1, 0, 1, 5, 1000, INT64_MAX, INT64_MIN};
static const int32_t edgeitems[] = {-1, 0, 1, 2, 3, 100, INT32_MAX};
static const int32_t linewidths[] = {INT32_MIN, -1, 0, 1, 2, 10, 75, INT32_MAX};
static const int32_t precisions[] = {-1, 0, 1, 8, 17, 399, 400, 401};
static const char signs[] = {'-', '+', ' ', 'x', '\0'};
static const int32_t widths[] = {INT32_MIN, -1, 0, 1, 20, 80, INT32_MAX};

static void
take_string(reader *r, char out[16])
{
    static const char chars[] = "nafiNAFI -+.x~";
    size_t len = take(r) % 17, i;

    memset(out, 0, 16);
    for (i = 0; i < len; i++) /* len 16 leaves no NUL */
        out[i] = chars[take(r) % (sizeof chars - 1)];
}

static void
take_options(reader *r, hcb_print_options *o, uint8_t flags)
{
    uint8_t b;

    o->struct_size = sizeof *o;
    if (flags & 0x20)
        o->struct_size = take(r) % 2 ? sizeof *o - 1 : 0;
    b = take(r);
    o->threshold = PICK(thresholds, b, (int64_t)(b >> 3));
    b = take(r);
    o->edgeitems = PICK(edgeitems, b, (int32_t)(b >> 4));
    b = take(r);
    o->linewidth = PICK(linewidths, b, (int32_t)b);
    b = take(r);
    o->precision = PICK(precisions, b, (int32_t)(b >> 3));
    o->floatmode = (hcb_floatmode)(take(r) % 6); /* 4 and 5 are invalid */
    b = take(r);
    o->sign = PICK(signs, b, (char)b);
    o->suppress = take(r) % 3 == 0;
    take_string(r, o->nanstr);
    take_string(r, o->infstr);
    b = take(r);
    o->width = PICK(widths, b, (int32_t)b);
}

/* ---- the output bound ---------------------------------------------------- */

/* The longest text of one element.  A float part is at most 17 columns of
 * left padding (a sign and 15-character nanstr/infstr, or a sign and the
 * integer digits, fewer than 9 in positional notation), a point, 400
 * fraction digits (the precision limit; in unique mode a float64 needs at
 * most 17 significant digits after 323 zeros) and a 5-column exponent:
 * 424, rounded up.  bfloat16 is %g of a float (at most 13). */
static size_t
max_elem_text(hcb_dtype t)
{
    switch (t) {
    case HCB_BOOL:
        return 5;
    case HCB_S8:
    case HCB_S16:
    case HCB_S32:
    case HCB_S64:
    case HCB_U8:
    case HCB_U16:
    case HCB_U32:
    case HCB_U64:
        return 21;
    case HCB_S2:
    case HCB_U2:
    case HCB_S4:
    case HCB_U4:
    case HCB_F4E2M1FN:
        return 4; /* "-8", "-1.5" */
    case HCB_BF16:
        return 16;
    case HCB_C64:
    case HCB_C128:
        return 2 * 440 + 1;
    default:
        return 440;
    }
}

/* A generous but finite bound on the text of an array of `n` elements of
 * rank `rank`, counted as if every element were shown: per element its text,
 * a separator and a line break with its indent (at most rank + 1 columns);
 * per sub-array (at most rank * n of them) two brackets, a "..." with its
 * separator and indent, and the blank lines between blocks (at most rank). */
static size_t
max_array_text(hcb_dtype t, int32_t rank, size_t n)
{
    size_t r = (size_t)rank;
    size_t per_elem = max_elem_text(t) + 1 + (r + 2);
    size_t per_sub = 2 + 4 + (r + 2) + r;

    return n * per_elem + r * n * per_sub + 16;
}

/* ---- one call, at every capacity ----------------------------------------- */

typedef int (*format_fn)(const void *ctx, char *buf, size_t cap, size_t *len,
                         hcb_error *err);

/* The keys and texts of the odd table: any bytes may be in them. */
typedef struct odd_string {
    const char *s;
    size_t len;
} odd_string;

static const odd_string odd_keys[] = {
    {"k\0", 2}, {"\xc3\xa9", 2}, {"\0", 1}, {"\xed\xb2\x80", 3}};
static const odd_string odd_texts[] = {
    {"a\0b", 3}, {"\xc3\xa9\xc3\xa9", 4}, {"\0\0\0", 3}, {"x\xed\xb2\x80y", 5}};

/* Whether `c` can be in a text: printable ASCII, a line break, or (with
 * `odd`) a byte of the odd strings. */
static int
text_byte(char c, int odd)
{
    return c == '\n' || (c >= ' ' && c <= '~') ||
           (odd && memchr("\0\xc3\xa9\xed\xb2\x80", c, 6) != NULL);
}

static void
check_text(const char *s, size_t len, int odd)
{
    size_t i;

    for (i = 0; i < len; i++)
        CHECK(text_byte(s[i], odd));
}

/* Runs fn at several capacities and checks the snprintf contract; returns
 * the code and (when OK) the whole text, which the caller frees. */
static int
run_all_caps(format_fn fn, const void *ctx, int odd, char **text,
             size_t *text_len)
{
    static const size_t caps[] = {1, 7, 64, 4096};
    hcb_error err;
    size_t len = (size_t)-1, n, i;
    const char *end;
    char *full;
    int rc;

    *text = NULL;
    *text_len = 0;
    memset(&err, 0x5a, sizeof err);
    rc = fn(ctx, NULL, 0, &len, &err);
    if (rc != HCB_OK) {
        CHECK(rc == HCB_EINVAL || rc == HCB_EUNIMPL || rc == HCB_ENOMEM);
        CHECK(err.code == rc);
        /* a message, NUL-terminated within its buffer */
        end = memchr(err.message, '\0', sizeof err.message);
        CHECK(end != NULL && end != err.message);
        for (i = 0; i < NELEMS(caps); i++) {
            char *buf = malloc(caps[i]);

            CHECK(buf != NULL);
            CHECK(fn(ctx, buf, caps[i], NULL, NULL) == rc);
            free(buf);
        }
        return rc;
    }
    CHECK(len != (size_t)-1);

    /* the whole text */
    full = malloc(len + 1);
    CHECK(full != NULL);
    n = (size_t)-1;
    CHECK(fn(ctx, full, len + 1, &n, NULL) == HCB_OK);
    CHECK(n == len);
    CHECK(full[len] == '\0' && (odd || strlen(full) == len));
    check_text(full, len, odd);

    for (i = 0; i < NELEMS(caps); i++) {
        size_t cap = caps[i], want = len < cap - 1 ? len : cap - 1;
        char *buf = malloc(cap); /* exact: ASan sees any write past cap */

        CHECK(buf != NULL);
        memset(buf, 0x7f, cap);
        n = (size_t)-1;
        CHECK(fn(ctx, buf, cap, &n, NULL) == HCB_OK);
        CHECK(n == len);
        CHECK(buf[want] == '\0');
        CHECK(odd || strlen(buf) == want);
        CHECK(memcmp(buf, full, want) == 0);
        free(buf);
    }
    *text = full;
    *text_len = len;
    return HCB_OK;
}

typedef struct array_call {
    const hcb_array *a;
    const hcb_print_options *o;
} array_call;

static int
format_array(const void *ctx, char *buf, size_t cap, size_t *len,
             hcb_error *err)
{
    const array_call *c = ctx;

    return hcb_format_array(c->a, c->o, buf, cap, len, err);
}

typedef struct value_call {
    const hcb_print_node *nodes;
    size_t nnodes;
    const hcb_array *arrays;
    size_t narrays;
    const hcb_print_options *o;
} value_call;

static int
format_value(const void *ctx, char *buf, size_t cap, size_t *len,
             hcb_error *err)
{
    const value_call *c = ctx;

    return hcb_format_value(c->nodes, c->nnodes, c->arrays, c->narrays, c->o,
                            buf, cap, len, err);
}

/* ---- an allocator that fails once ---------------------------------------- */

static long alloc_countdown = -1; /* the fuzzer runs one input at a time */

static void *
failing_alloc(void *user, size_t size)
{
    (void)user;
    if (alloc_countdown >= 0 && alloc_countdown-- == 0)
        return NULL;
    return malloc(size);
}

static void
plain_free(void *user, void *ptr)
{
    (void)user;
    free(ptr);
}

/* Runs fn once with allocation number `k` failing: it must fail cleanly
 * (ASan's leak check sees the rest) or give the same text. */
static void
run_failing(format_fn fn, const void *ctx, long k, const char *text, size_t len)
{
    hcb_allocator a = {sizeof a, failing_alloc, plain_free, NULL};
    char *buf = malloc(len + 1);
    size_t n = 0;
    int rc;

    CHECK(buf != NULL);
    hcb_set_allocator(&a);
    alloc_countdown = k;
    rc = fn(ctx, buf, len + 1, &n, NULL);
    alloc_countdown = -1;
    hcb_set_allocator(NULL);
    CHECK(rc == HCB_OK || rc == HCB_ENOMEM);
    if (rc == HCB_OK)
        CHECK(n == len && memcmp(buf, text, len + 1) == 0);
    free(buf);
}

/* ---- the harness --------------------------------------------------------- */

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size};
    uint8_t flags = take(&r), b;
    hcb_print_options opts;
    const hcb_print_options *o = &opts;
    int64_t dims[4];
    hcb_array a, arrays[3];
    hcb_print_node nodes[MAX_NODES];
    size_t nelems = 1, nbytes, nnodes = 0, narrays = 0, len = 0, i;
    int32_t rank, d, widest;
    long oom_at = -1;
    char *text = NULL;
    uint8_t *elems;
    array_call ac;
    int rc;

    /* the array */
    b = take(&r);
    a.dtype = b % (NDTYPES + 1) < NDTYPES ? dtypes[b % (NDTYPES + 1)]
                                          : (hcb_dtype)take(&r);
    rank = take(&r) % 5;
    for (d = 0; d < rank; d++) {
        b = take(&r);
        dims[d] = b & 0x80 ? b & 0x3f : b % 8;
    }
    for (;;) {
        nelems = 1;
        for (d = 0, widest = 0; d < rank; d++) {
            nelems *= (size_t)dims[d];
            if (dims[d] > dims[widest])
                widest = d;
        }
        if (nelems <= MAX_ELEMS)
            break;
        dims[widest] /= 2;
    }
    a.rank = rank;
    a.dims = flags & 0x10 ? NULL : dims;
    nbytes =
        hcb_dtype_bits(a.dtype) != 0 ? hcb_dtype_nbytes(a.dtype, nelems) : 0;
    a.nbytes = nbytes;

    take_options(&r, &opts, flags);
    if (flags & 0x04)
        o = NULL;

    /* the value tree: nodes over up to three arrays (this one, twice, and
     * a fixed one), most of it well formed, some not */
    if (flags & 0x01) {
        static const char *const keys[] = {"a", "key", "", "k=v"};
        static const char *const texts[] = {"x", "", "some text",
                                            "0123456789abcdef"};

        nnodes = take(&r) % (MAX_NODES + 1);
        for (i = 0; i < nnodes; i++) {
            uint8_t kind = take(&r), count = take(&r), extra = take(&r);

            nodes[i].kind = (hcb_print_kind)(kind % 6);     /* 5 is invalid */
            nodes[i].count = count >= 250 ? -1 : count % 6; /* -1 is bad */
            nodes[i].key = extra & 0x04   ? NULL
                           : extra & 0x08 ? odd_keys[extra % 4].s
                                          : keys[extra % 4];
            nodes[i].key_len = extra & 0x04   ? 0
                               : extra & 0x08 ? odd_keys[extra % 4].len
                                              : strlen(keys[extra % 4]);
            nodes[i].text = extra & 0x40   ? NULL
                            : extra & 0x80 ? odd_texts[(extra >> 4) % 4].s
                                           : texts[(extra >> 4) % 4];
            nodes[i].text_len = extra & 0x40 ? 0
                                : extra & 0x80
                                    ? odd_texts[(extra >> 4) % 4].len
                                    : strlen(texts[(extra >> 4) % 4]);
        }
        narrays = take(&r) % 4;
    }
    if (flags & 0x08)
        oom_at = take(&r) % 32;

    /* the elements: what is left, zero-padded */
    elems = calloc(nbytes + 1, 1);
    if (elems == NULL)
        return 0;
    memcpy(elems, r.p, r.n < nbytes ? r.n : nbytes);
    a.data = elems;
    if (flags & 0x02)
        a.nbytes = nbytes + 1 - 2 * (nbytes > 0); /* wrong either way */

    ac.a = &a;
    ac.o = o;
    rc = run_all_caps(format_array, &ac, 0, &text, &len);
    if (rc == HCB_OK) {
        CHECK(len <= max_array_text(a.dtype, a.rank, nelems));
        if (oom_at >= 0)
            run_failing(format_array, &ac, oom_at, text, len);
    }
    free(text);

    if (flags & 0x01) {
        static const int32_t fixed_data[3] = {-1, 20, 300};
        static const int64_t fixed_dims[1] = {3};
        hcb_array fixed = {HCB_S32, 1, fixed_dims, (void *)fixed_data,
                           sizeof fixed_data};
        value_call vc;
        size_t bound = 0;
        char *vtext = NULL;

        arrays[0] = a;
        arrays[1] = fixed;
        arrays[2] = a;
        vc.nodes = nodes;
        vc.nnodes = nnodes;
        vc.arrays = arrays;
        vc.narrays = narrays;
        vc.o = o;
        rc = run_all_caps(format_value, &vc, 1, &vtext, &len);
        if (rc == HCB_OK) {
            /* every array at most once, plus per node its brackets, key,
             * text (16 at most) and a line break with an indent of two per
             * level */
            for (i = 0; i < narrays; i++)
                bound += max_array_text(arrays[i].dtype, arrays[i].rank,
                                        i == 1 ? 3 : nelems);
            bound += nnodes * (4 + 4 + 16 + 1 + 2 * nnodes);
            CHECK(len <= bound);
            if (oom_at >= 0)
                run_failing(format_value, &vc, oom_at, vtext, len);
        }
        free(vtext);
    }
    free(elems);
    return 0;
}
