/*
 * record.c - creating tap records: one allocation, one copy per byte.
 */
#include <string.h>

#include "record.h"

static size_t
align_up(size_t n)
{
    return (n + HCB__PAYLOAD_ALIGN - 1) & ~(size_t)(HCB__PAYLOAD_ALIGN - 1);
}

/* Checks that a view describes what it claims, so the copy below reads
 * exactly the bytes the producer owns. */
static int
check_view(const hcb_array *a, size_t i, hcb_error *err)
{
    size_t item = hcb_dtype_size(a->dtype);
    size_t n = 1;
    int32_t d;

    if (item == 0)
        return hcb_error_set(err, HCB_EINVAL,
                             "argument %zu has unsupported type %s (code %d)",
                             i, hcb_dtype_name(a->dtype), (int)a->dtype);
    if (a->rank < 0 || a->rank > HCB_MAX_RANK)
        return hcb_error_set(err, HCB_EINVAL,
                             "argument %zu has rank %d, expected 0..%d", i,
                             (int)a->rank, HCB_MAX_RANK);
    if (a->rank > 0 && a->dims == NULL)
        return hcb_error_set(err, HCB_EINVAL,
                             "argument %zu has rank %d but no dims", i,
                             (int)a->rank);
    for (d = 0; d < a->rank; d++) {
        if (a->dims[d] < 0)
            return hcb_error_set(err, HCB_EINVAL,
                                 "argument %zu has negative dimension %lld", i,
                                 (long long)a->dims[d]);
        if (a->dims[d] != 0 && n > SIZE_MAX / (size_t)a->dims[d])
            return hcb_error_set(err, HCB_EINVAL, "argument %zu is too large",
                                 i);
        n *= (size_t)a->dims[d];
    }
    if (n > SIZE_MAX / item || n * item != a->nbytes)
        return hcb_error_set(err, HCB_EINVAL,
                             "argument %zu claims %zu bytes, its shape "
                             "holds %zu",
                             i, a->nbytes, n * item);
    if (a->nbytes > 0 && a->data == NULL)
        return hcb_error_set(err, HCB_EINVAL, "argument %zu has no data", i);
    return HCB_OK;
}

int
hcb_record_create(uint64_t callback_id, hcb_device device,
                  const hcb_array *args, size_t nargs, hcb_record **out,
                  hcb_error *err)
{
    size_t i, ndims = 0, size;
    hcb_record *rec;
    int64_t *dims;
    char *payload;
    int rc;

    *out = NULL;
    if (nargs > 0 && args == NULL)
        return hcb_error_set(err, HCB_EINVAL, "nargs is %zu but args is NULL",
                             nargs);
    if (nargs > ((size_t)1 << 20))
        return hcb_error_set(err, HCB_EINVAL, "too many arguments: %zu", nargs);
    for (i = 0; i < nargs; i++) {
        if ((rc = check_view(&args[i], i, err)) != HCB_OK)
            return rc;
        ndims += (size_t)args[i].rank;
    }
    size = align_up(sizeof *rec + nargs * sizeof(hcb_array) +
                    ndims * sizeof(int64_t));
    for (i = 0; i < nargs; i++) {
        size_t grown = size + align_up(args[i].nbytes);

        if (grown < size)
            return hcb_error_set(err, HCB_EINVAL, "record too large");
        size = grown;
    }
    rec = hcb__malloc(size);
    if (rec == NULL)
        return hcb_error_set(err, HCB_ENOMEM,
                             "cannot allocate a %zu-byte tap record", size);

    atomic_init(&rec->refs, 1);
    rec->next = NULL;
    rec->size = size;
    rec->callback_id = callback_id;
    rec->device = device;
    rec->nargs = nargs;
    rec->args = (hcb_array *)(rec + 1);
    dims = (int64_t *)(rec->args + nargs);
    payload = (char *)rec + align_up(sizeof *rec + nargs * sizeof(hcb_array) +
                                     ndims * sizeof(int64_t));
    for (i = 0; i < nargs; i++) {
        hcb_array *a = &rec->args[i];

        *a = args[i];
        if (a->rank > 0)
            memcpy(dims, args[i].dims, (size_t)a->rank * sizeof *dims);
        a->dims = a->rank > 0 ? dims : NULL;
        dims += a->rank;
        a->data = payload;
        if (a->nbytes > 0)
            memcpy(payload, args[i].data, a->nbytes);
        payload += align_up(a->nbytes);
    }
    *out = rec;
    return HCB_OK;
}

void
hcb_record_retain(hcb_record *rec)
{
    atomic_fetch_add_explicit(&rec->refs, 1, memory_order_relaxed);
}

void
hcb_record_release(hcb_record *rec)
{
    if (rec == NULL)
        return;
    if (atomic_fetch_sub_explicit(&rec->refs, 1, memory_order_acq_rel) == 1)
        hcb__free(rec);
}

uint64_t
hcb_record_callback_id(const hcb_record *rec)
{
    return rec->callback_id;
}

hcb_device
hcb_record_device(const hcb_record *rec)
{
    return rec->device;
}

size_t
hcb_record_nargs(const hcb_record *rec)
{
    return rec->nargs;
}

const hcb_array *
hcb_record_args(const hcb_record *rec)
{
    return rec->args;
}

size_t
hcb_record_size(const hcb_record *rec)
{
    return rec->size;
}
