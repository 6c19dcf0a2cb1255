// test_cxx_headers.cpp - the public headers compile as C++ (with -Wall
// -Wextra -Wpedantic) and work from C++: a runtime with a tap target, and a
// handler defined with HCB_FFI_HANDLER that answers XLA's metadata probe.
#include <cstdio>
#include <cstring>

#include "hcb/hcb.h"
#if defined(__clang__) || !defined(__GNUC__)
#include "hcb/ffi.h" // g++ rejects XLA's c_api.h itself, not ours
#define HAVE_FFI 1
#endif

namespace
{

int seen = 0;

int
count_tap(void *user, hcb_record *rec, hcb_error *err)
{
    (void)user, (void)err;
    seen += static_cast<int>(hcb_record_nargs(rec));
    return HCB_OK;
}

#ifdef HAVE_FFI
int
noop_body(XLA_FFI_CallFrame *frame, hcb_error *err)
{
    return hcb_ffi_check_counts(frame, 0, 0, err);
}
#endif

} // namespace

#ifdef HAVE_FFI
HCB_FFI_HANDLER(cxx_noop, noop_body, 0)
#endif

int
main()
{
    hcb_runtime *rt = nullptr;
    hcb_tap_target target = HCB_TAP_TARGET_INIT;
    hcb_record *rec = nullptr;
    hcb_error err;
    uint64_t id = 0;
    float x = 1.0f;
    hcb_array a = {HCB_F32, 0, nullptr, &x, sizeof x};

    if (hcb_version() != HCB_VERSION_NUMBER)
        return 1;
    target.fn = count_tap;
    if (hcb_runtime_create(nullptr, &rt, &err) != HCB_OK ||
        hcb_runtime_register_tap(rt, &target, &id, &err) != HCB_OK ||
        hcb_record_create(id, HCB_DEVICE(HCB_PLATFORM_CPU, 0), &a, 1, &rec,
                          &err) != HCB_OK ||
        hcb_runtime_submit(rt, rec, &err) != HCB_OK ||
        hcb_runtime_barrier(rt, HCB_ALL_DEVICES, &err) != HCB_OK) {
        std::fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    hcb_runtime_destroy(rt);
    std::printf("C++: %d tapped array(s)\n", seen);
#ifdef HAVE_FFI
    XLA_FFI_Metadata md;
    XLA_FFI_Metadata_Extension ext;
    XLA_FFI_CallFrame frame;
    std::memset(&md, 0, sizeof md);
    std::memset(&frame, 0, sizeof frame);
    ext.extension_base.struct_size = XLA_FFI_Metadata_Extension_STRUCT_SIZE;
    ext.extension_base.type = XLA_FFI_Extension_Metadata;
    ext.extension_base.next = nullptr;
    ext.metadata = &md;
    frame.extension_start = &ext.extension_base;
    // No XLA_FFI_Api in the frame, as XLA of FFI API 0.1 probes: 0.1.
    if (cxx_noop(&frame) != nullptr ||
        md.api_version.minor_version != HCB_FFI_API_MINOR_OLDEST)
        return 1;
    std::printf("C++: probe answered 0.%d\n", md.api_version.minor_version);
#endif
    return seen == 1 ? 0 : 1;
}
