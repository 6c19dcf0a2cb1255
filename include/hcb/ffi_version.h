/*
 * ffi_version.h - the XLA FFI API version libhcb's handlers report, and the
 * names that differ between the XLA FFI headers of the supported jaxlibs.
 * Included by hcb/ffi.h; a handler author needs none of it directly.
 *
 * FFI API versions.  The handlers report FFI API version 0.3
 * (HCB_FFI_API_MAJOR/MINOR), the newest version every supported jaxlib
 * accepts (JAX 0.10 ships FFI API 0.3, 0.11 ships 0.4, 0.12 ships 0.5),
 * whatever header they were compiled against, and they use only the 0.3
 * layout of every structure: a handler built against any of these headers
 * registers and runs under all of them.  The XLA header is jaxlib's
 * (`jax.ffi.include_dir()`).
 *
 * Compiles as C11 and as C++.
 */
#ifndef HCB_FFI_VERSION_H
#define HCB_FFI_VERSION_H

#include <stdbool.h>

#include "hcb/hcb.h"
#include "xla/ffi/api/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HCB_FFI_API_MAJOR 0
#define HCB_FFI_API_MINOR 3

/* FFI API 0.4 renamed two things a handler touches, keeping their layout:
 * the extension at the head of every structure (XLA_FFI_Extension_Base ->
 * XLA_FFI_InternalExtension) and the function that reads an error's message
 * (XLA_FFI_Error_GetMessage -> XLA_FFI_Error_GetDetails, same slot in
 * XLA_FFI_Api, its arguments grew an `errc` after `message`).  These names
 * work with every header. */
#if XLA_FFI_API_MAJOR == 0 && XLA_FFI_API_MINOR < 4
typedef XLA_FFI_Extension_Base hcb_ffi_extension;
typedef XLA_FFI_Error_GetMessage_Args hcb_ffi_error_message_args;
#define HCB_FFI_API_ERROR_MESSAGE XLA_FFI_Error_GetMessage
#else
typedef XLA_FFI_InternalExtension hcb_ffi_extension;
typedef XLA_FFI_Error_GetDetails_Args hcb_ffi_error_message_args;
#define HCB_FFI_API_ERROR_MESSAGE XLA_FFI_Error_GetDetails
#endif
/* The size of those arguments in the header built against: a runtime as
 * new as that header checks the struct is whole (0.4 and later read and
 * write `errc`), and the newer runtimes accept it (the ABI grows by
 * struct_size). */
#if XLA_FFI_API_MAJOR == 0 && XLA_FFI_API_MINOR < 4
#define HCB_FFI_ERROR_MESSAGE_ARGS_SIZE                                        \
    XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE
#else
#define HCB_FFI_ERROR_MESSAGE_ARGS_SIZE                                        \
    XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE
#endif

/* Answers XLA's registration-time metadata probe.  Call it first in every
 * handler: it returns true when `frame` was the probe (it has filled the
 * metadata; return NULL), false for a real call.  `traits` is a mask of
 * XLA_FFI_HANDLER_TRAITS_* (0 for a handler that must not be captured in a
 * command buffer). */
static inline bool
hcb_ffi_answer_probe(XLA_FFI_CallFrame *frame, XLA_FFI_Handler_Traits traits)
{
    hcb_ffi_extension *ext = frame->extension_start;
    XLA_FFI_Metadata *md;

    if (ext == NULL || ext->type != XLA_FFI_Extension_Metadata)
        return false;
    md = ((XLA_FFI_Metadata_Extension *)ext)->metadata;
    md->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    md->api_version.extension_start = NULL;
    md->api_version.major_version = HCB_FFI_API_MAJOR;
    md->api_version.minor_version = HCB_FFI_API_MINOR;
    md->traits = traits;
    /* state_type_id lies past XLA_FFI_Metadata_STRUCT_SIZE but XLA always
     * allocates the whole struct; zero means stateless. */
    md->state_type_id.type_id = 0;
    return true;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HCB_FFI_VERSION_H */
