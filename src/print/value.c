/*
 * value.c - id_print's layout of a value: tuples, lists and dicts of
 * arrays (array.c) the way JAX's pretty printer lays them out, on one line
 * when they fit, else one child per line, nested two columns deeper; and
 * hcb_format_value.  debug.print's text is the same tree: a CONCAT of its
 * literal TEXT nodes and a FIELD node for each replacement field.
 */
#include <fenv.h>
#include <string.h>

#include "base/common.h"
#include "print/print.h"

/* ---- values (JAX's pretty printer, as id_print uses it) -------------------
 */

typedef struct tree {
    const hcb_print_node *nodes;
    size_t nnodes;
    size_t *width; /* per node: its width on one line */
    size_t *start; /* per array node: where its text begins in `texts` */
    size_t *tlen;  /* per array node: its length */
    textbuf texts;
    const hcb_array *arrays;
    size_t narrays, next_array;
    const hcb_print_options *o;
    hcb_error *err;
    int rc;
} tree;

static const char *const opens[] = {"", "", "( ", "[ ", "{ "};
static const char *const closes[] = {"", "", " )", " ]", " }"};

/* Whether a node takes the next array (ARRAY and STR differ in its text). */
static bool
takes_array(hcb_print_kind kind)
{
    return kind == HCB_PRINT_ARRAY || kind == HCB_PRINT_STR ||
           kind == HCB_PRINT_FIELD;
}

/* Checks the subtree at `i`, formats its arrays, computes widths; returns
 * the index after it, or nnodes + 1 on error (t->rc says which). */
static size_t
measure(tree *t, size_t i, bool in_dict, int depth)
{
    const hcb_print_node *nd;
    size_t j, w;
    int32_t c;

    if (i >= t->nnodes || depth > 256) {
        t->rc =
            hcb_error_set(t->err, HCB_EINVAL,
                          i >= t->nnodes ? "print nodes end inside a container"
                                         : "print nodes nest too deep");
        return t->nnodes + 1;
    }
    nd = &t->nodes[i];
    if (in_dict && nd->key == NULL) {
        t->rc = hcb_error_set(t->err, HCB_EINVAL,
                              "print node %zu is in a dict but has no key", i);
        return t->nnodes + 1;
    }
    switch (nd->kind) {
    case HCB_PRINT_ARRAY:
    case HCB_PRINT_STR:
    case HCB_PRINT_FIELD:
        if (t->next_array >= t->narrays) {
            t->rc = hcb_error_set(t->err, HCB_EINVAL,
                                  "print nodes use more than the %zu arrays "
                                  "given",
                                  t->narrays);
            return t->nnodes + 1;
        }
        t->start[i] = t->texts.len;
        t->rc = nd->kind != HCB_PRINT_ARRAY
                    ? hcb__append_str(&t->texts, &t->arrays[t->next_array],
                                      t->o, nd->kind == HCB_PRINT_FIELD, t->err)
                    : hcb__append_array(&t->texts, &t->arrays[t->next_array],
                                        t->o, t->err);
        if (t->rc != HCB_OK)
            return t->nnodes + 1;
        t->next_array++;
        t->width[i] = t->tlen[i] = t->texts.len - t->start[i];
        return i + 1;
    case HCB_PRINT_TEXT:
        if (nd->text == NULL) {
            t->rc = hcb_error_set(t->err, HCB_EINVAL,
                                  "print node %zu is text but has none", i);
            return t->nnodes + 1;
        }
        t->width[i] = strlen(nd->text);
        return i + 1;
    case HCB_PRINT_TUPLE:
    case HCB_PRINT_LIST:
    case HCB_PRINT_DICT:
    case HCB_PRINT_CONCAT:
        if (nd->count < 0) {
            t->rc = hcb_error_set(t->err, HCB_EINVAL,
                                  "print node %zu has %d children", i,
                                  (int)nd->count);
            return t->nnodes + 1;
        }
        w = nd->kind == HCB_PRINT_CONCAT
                ? 0
                : 4 + (nd->count > 0 ? (size_t)nd->count - 1 : 0);
        for (j = i + 1, c = 0; c < nd->count; c++) {
            size_t child = j;

            j = measure(t, j, nd->kind == HCB_PRINT_DICT, depth + 1);
            if (j > t->nnodes)
                return j;
            w += t->width[child];
            if (nd->kind == HCB_PRINT_DICT)
                w += strlen(t->nodes[child].key) + 1;
        }
        t->width[i] = w;
        return j;
    default:
        t->rc = hcb_error_set(t->err, HCB_EINVAL,
                              "print node %zu has kind %d, expected 0..7", i,
                              (int)nd->kind);
        return t->nnodes + 1;
    }
}

/* Lays out the subtree at `i` (measured) at column *col, children indented
 * to `indent` + 2; `flat` when an enclosing container is on one line. */
static size_t
render(tree *t, textbuf *out, size_t i, size_t indent, bool flat, size_t *col)
{
    const hcb_print_node *nd = &t->nodes[i];
    size_t j;
    int32_t c;

    if (takes_array(nd->kind)) {
        hcb__textbuf_put(out, t->texts.p + t->start[i], t->tlen[i]);
        *col += t->tlen[i];
        return i + 1;
    }
    if (nd->kind == HCB_PRINT_TEXT) {
        hcb__textbuf_put(out, nd->text, t->width[i]);
        *col += t->width[i];
        return i + 1;
    }
    if (nd->kind == HCB_PRINT_CONCAT) {
        for (j = i + 1, c = 0; c < nd->count; c++)
            j = render(t, out, j, indent, flat, col);
        return j;
    }
    flat = flat ||
           *col + t->width[i] <= (size_t)(t->o->width < 0 ? 0 : t->o->width);
    hcb__textbuf_put(out, opens[nd->kind], 2);
    *col += 2;
    for (j = i + 1, c = 0; c < nd->count; c++) {
        if (c > 0 && flat) {
            hcb__textbuf_putc(out, ' ');
            *col += 1;
        } else if (c > 0) {
            hcb__textbuf_putc(out, '\n');
            hcb__textbuf_fill(out, ' ', indent + 2);
            *col = indent + 2;
        }
        if (nd->kind == HCB_PRINT_DICT) {
            size_t kl = strlen(t->nodes[j].key);

            hcb__textbuf_put(out, t->nodes[j].key, kl);
            hcb__textbuf_putc(out, '=');
            *col += kl + 1;
        }
        j = render(t, out, j, indent + 2, flat, col);
    }
    hcb__textbuf_put(out, closes[nd->kind], 2);
    *col += 2;
    return j;
}

static int
format_value_in_default_env(const hcb_print_node *nodes, size_t nnodes,
                            const hcb_array *arrays, size_t narrays,
                            const hcb_print_options *opts, char *buf,
                            size_t cap, size_t *len, hcb_error *err)
{
    tree t;
    textbuf out = {0};
    size_t end, col = 0;
    int rc;

    if (opts == NULL)
        opts = &hcb__default_print_options;
    if ((buf == NULL && cap > 0) || (nodes == NULL && nnodes > 0) ||
        (arrays == NULL && narrays > 0))
        return hcb_error_set(err, HCB_EINVAL,
                             "buf, nodes or arrays is NULL with a non-zero "
                             "count");
    rc = hcb__check_print_options(opts, err);
    if (rc != HCB_OK)
        return rc;
    if (nnodes == 0)
        return hcb_error_set(err, HCB_EINVAL, "no print nodes");
    memset(&t, 0, sizeof t);
    t.nodes = nodes;
    t.nnodes = nnodes;
    t.arrays = arrays;
    t.narrays = narrays;
    t.o = opts;
    t.err = err;
    t.width = hcb__calloc(nnodes, 3 * sizeof(size_t));
    if (t.width == NULL)
        return hcb_error_set(err, HCB_ENOMEM, "out of memory formatting");
    t.start = t.width + nnodes;
    t.tlen = t.start + nnodes;
    end = measure(&t, 0, false, 0);
    rc = t.rc;
    if (rc == HCB_OK && end != nnodes)
        rc = hcb_error_set(err, HCB_EINVAL,
                           "print nodes describe a tree of %zu nodes, but "
                           "%zu were given",
                           end, nnodes);
    if (rc == HCB_OK && t.next_array != narrays)
        rc = hcb_error_set(err, HCB_EINVAL,
                           "print nodes use %zu arrays, but %zu were given",
                           t.next_array, narrays);
    if (rc == HCB_OK && t.texts.oom)
        rc = hcb_error_set(err, HCB_ENOMEM, "out of memory formatting");
    if (rc == HCB_OK)
        render(&t, &out, 0, 0, false, &col);
    hcb__free(t.texts.p);
    hcb__free(t.width);
    if (rc != HCB_OK) {
        hcb__free(out.p);
        return rc;
    }
    return hcb__textbuf_finish(&out, buf, cap, len, err);
}

HCB_API int
hcb_format_value(const hcb_print_node *nodes, size_t nnodes,
                 const hcb_array *arrays, size_t narrays,
                 const hcb_print_options *opts, char *buf, size_t cap,
                 size_t *len, hcb_error *err)
{
    fenv_t env;
    int rc;

    fegetenv(&env);
    fesetenv(FE_DFL_ENV);
    rc = format_value_in_default_env(nodes, nnodes, arrays, narrays, opts, buf,
                                     cap, len, err);
    fesetenv(&env);
    return rc;
}
