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

/* A container being measured or rendered: the tree is walked with a stack
 * of these (as deep as the tree), not by recursion, so that any nesting a
 * caller can build is printed without running out of the thread's stack. */
typedef struct frame {
    size_t node;   /* the container's index */
    int32_t left;  /* children still to measure or render */
    size_t width;  /* measure: the width so far */
    size_t indent; /* render: the container's indent */
    bool flat;     /* render: the container is on one line */
    bool started;  /* render: a child has been rendered */
} frame;

typedef struct tree {
    const hcb_print_node *nodes;
    size_t nnodes;
    size_t *width; /* per node: its width on one line */
    size_t *start; /* per array node: where its text begins in `texts` */
    size_t *tlen;  /* per array node: its length */
    frame *frames; /* nnodes of them: the open containers */
    textbuf texts;
    const hcb_array *arrays;
    size_t narrays, next_array;
    const hcb_print_options *o;
    hcb_error *err;
    int rc;
} tree;

static const char *const opens[] = {"", "", "( ", "[ ", "{ "};
static const char *const closes[] = {"", "", " )", " ]", " }"};

/* The width of `n` bytes of UTF-8 text in characters: the bytes that do
 * not continue a character (any other byte, NUL included, is one). */
static size_t
text_width(const char *p, size_t n)
{
    size_t i, w = 0;

    for (i = 0; i < n; i++)
        w += ((unsigned char)p[i] & 0xC0) != 0x80;
    return w;
}

/* Whether a node takes the next array (ARRAY and STR differ in its text). */
static bool
takes_array(hcb_print_kind kind)
{
    return kind == HCB_PRINT_ARRAY || kind == HCB_PRINT_STR ||
           kind == HCB_PRINT_FIELD;
}

static bool
is_container(hcb_print_kind kind)
{
    return kind == HCB_PRINT_TUPLE || kind == HCB_PRINT_LIST ||
           kind == HCB_PRINT_DICT || kind == HCB_PRINT_CONCAT;
}

/* Measures node `i`, whose parent is a dict when `in_dict`: checks it,
 * formats its array, sets its width unless it is a container with
 * children.  Returns false on error (t->rc says which). */
static bool
measure_node(tree *t, size_t i, bool in_dict)
{
    const hcb_print_node *nd = &t->nodes[i];

    if (in_dict && nd->key == NULL) {
        t->rc = hcb_error_set(t->err, HCB_EINVAL,
                              "print node %zu is in a dict but has no key", i);
        return false;
    }
    if (takes_array(nd->kind)) {
        if (t->next_array >= t->narrays) {
            t->rc = hcb_error_set(t->err, HCB_EINVAL,
                                  "print nodes use more than the %zu arrays "
                                  "given",
                                  t->narrays);
            return false;
        }
        t->start[i] = t->texts.len;
        t->rc = nd->kind != HCB_PRINT_ARRAY
                    ? hcb__append_str(&t->texts, &t->arrays[t->next_array],
                                      t->o, nd->kind == HCB_PRINT_FIELD, t->err)
                    : hcb__append_array(&t->texts, &t->arrays[t->next_array],
                                        t->o, t->err);
        if (t->rc != HCB_OK)
            return false;
        t->next_array++;
        t->width[i] = t->tlen[i] = t->texts.len - t->start[i];
        return true;
    }
    if (nd->kind == HCB_PRINT_TEXT) {
        if (nd->text == NULL) {
            t->rc = hcb_error_set(t->err, HCB_EINVAL,
                                  "print node %zu is text but has none", i);
            return false;
        }
        t->width[i] = text_width(nd->text, nd->text_len);
        return true;
    }
    if (!is_container(nd->kind)) {
        t->rc = hcb_error_set(t->err, HCB_EINVAL,
                              "print node %zu has kind %d, expected 0..7", i,
                              (int)nd->kind);
        return false;
    }
    if (nd->count < 0) {
        t->rc =
            hcb_error_set(t->err, HCB_EINVAL, "print node %zu has %d children",
                          i, (int)nd->count);
        return false;
    }
    /* the brackets and the spaces between the children */
    t->width[i] = nd->kind == HCB_PRINT_CONCAT
                      ? 0
                      : 4 + (nd->count > 0 ? (size_t)nd->count - 1 : 0);
    return true;
}

/* Checks the tree at node 0, formats its arrays, computes widths; returns
 * the index after it, or nnodes + 1 on error (t->rc says which). */
static size_t
measure(tree *t)
{
    size_t i = 0, depth = 0, done;

    for (;;) {
        const hcb_print_node *nd;
        bool in_dict = depth > 0 && t->nodes[t->frames[depth - 1].node].kind ==
                                        HCB_PRINT_DICT;

        if (i >= t->nnodes) {
            t->rc = hcb_error_set(t->err, HCB_EINVAL,
                                  "print nodes end inside a container");
            return t->nnodes + 1;
        }
        if (!measure_node(t, i, in_dict))
            return t->nnodes + 1;
        nd = &t->nodes[i];
        if (is_container(nd->kind) && nd->count > 0) {
            t->frames[depth++] =
                (frame){.node = i, .left = nd->count, .width = t->width[i]};
            i++;
            continue;
        }
        /* node `done` is complete: its width goes to its container, which
         * is complete too once it has all of its children */
        done = i++;
        for (;;) {
            frame *f;

            if (depth == 0)
                return i;
            f = &t->frames[depth - 1];
            f->width += t->width[done];
            if (t->nodes[f->node].kind == HCB_PRINT_DICT)
                f->width +=
                    text_width(t->nodes[done].key, t->nodes[done].key_len) + 1;
            if (--f->left > 0)
                break;
            t->width[f->node] = f->width;
            done = f->node;
            depth--;
        }
    }
}

/* Lays out the measured tree at node 0: containers on one line when they
 * fit in the width from where they start, else one child per line,
 * indented two more than their container; CONCAT's children inline. */
static void
render(tree *t, textbuf *out)
{
    size_t i = 0, depth = 0, col = 0, indent = 0, maxw;
    bool flat = false;

    maxw = (size_t)(t->o->width < 0 ? 0 : t->o->width);
    for (;;) {
        const hcb_print_node *nd = &t->nodes[i];

        if (takes_array(nd->kind)) {
            hcb__textbuf_put(out, t->texts.p + t->start[i], t->tlen[i]);
            col += t->tlen[i];
        } else if (nd->kind == HCB_PRINT_TEXT) {
            hcb__textbuf_put(out, nd->text, nd->text_len);
            col += t->width[i];
        } else {
            if (nd->kind != HCB_PRINT_CONCAT) {
                flat = flat || col + t->width[i] <= maxw;
                hcb__textbuf_put(out, opens[nd->kind], 2);
                col += 2;
            }
            t->frames[depth++] = (frame){
                .node = i, .left = nd->count, .indent = indent, .flat = flat};
        }
        i++;
        /* the next node to render: the next child of the innermost
         * container that has one, closing those that have none left */
        for (;;) {
            frame *f;
            hcb_print_kind kind;

            if (depth == 0)
                return;
            f = &t->frames[depth - 1];
            kind = t->nodes[f->node].kind;
            if (f->left == 0) {
                if (kind != HCB_PRINT_CONCAT) {
                    hcb__textbuf_put(out, closes[kind], 2);
                    col += 2;
                }
                depth--;
                continue;
            }
            if (kind != HCB_PRINT_CONCAT && f->started && f->flat) {
                hcb__textbuf_putc(out, ' ');
                col += 1;
            } else if (kind != HCB_PRINT_CONCAT && f->started) {
                hcb__textbuf_putc(out, '\n');
                hcb__textbuf_fill(out, ' ', f->indent + 2);
                col = f->indent + 2;
            }
            f->started = true;
            f->left--;
            if (kind == HCB_PRINT_DICT) {
                const hcb_print_node *child = &t->nodes[i];

                hcb__textbuf_put(out, child->key, child->key_len);
                hcb__textbuf_putc(out, '=');
                col += text_width(child->key, child->key_len) + 1;
            }
            indent = kind == HCB_PRINT_CONCAT ? f->indent : f->indent + 2;
            flat = f->flat;
            break;
        }
    }
}

static int
format_value_in_default_env(const hcb_print_node *nodes, size_t nnodes,
                            const hcb_array *arrays, size_t narrays,
                            const hcb_print_options *opts, char *buf,
                            size_t cap, size_t *len, hcb_error *err)
{
    tree t;
    textbuf out = {0};
    size_t end;
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
    t.frames = hcb__calloc(nnodes, sizeof(frame));
    if (t.width == NULL || t.frames == NULL) {
        hcb__free(t.width);
        hcb__free(t.frames);
        return hcb_error_set(err, HCB_ENOMEM, "out of memory formatting");
    }
    t.start = t.width + nnodes;
    t.tlen = t.start + nnodes;
    end = measure(&t);
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
        render(&t, &out);
    hcb__free(t.texts.p);
    hcb__free(t.width);
    hcb__free(t.frames);
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
