/*
 * ffi_version.h - the XLA FFI API version libhcb's handlers report, and the
 * names that differ between the XLA FFI headers of the supported jaxlibs.
 * Included by hcb/ffi.h; a handler author needs none of it directly.
 *
 * FFI API versions.  A handler speaks the version of the XLA that calls it,
 * up to FFI API 0.3 (HCB_FFI_API_MINOR): JAX 0.6 and 0.7 ship FFI API 0.1
 * and accept only 0.1, 0.8 ships 0.2 (accepts 0.1 and 0.2), 0.9 and 0.10
 * ship 0.3, 0.11 ships 0.4 and 0.12 ships 0.5 (both accept 0.3).  The
 * version is read from the call frame at run time, not from the header
 * compiled against, and the three structures whose layout differs between
 * 0.1 and 0.3 (a handler's metadata, a state's arguments, a type's
 * registration) are declared here in each layout: a handler built against
 * any supported jaxlib's header (`jax.ffi.include_dir()`) registers and
 * runs under all of them.
 *
 * Compiles as C11 and as C++.
 */
#ifndef HCB_FFI_VERSION_H
#define HCB_FFI_VERSION_H

#include <stdbool.h>
#include <stddef.h>

#include "hcb/hcb.h"
#include "xla/ffi/api/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HCB_FFI_API_MAJOR        0
#define HCB_FFI_API_MINOR        3 /* the newest version spoken */
#define HCB_FFI_API_MINOR_OLDEST 1 /* the oldest */

/* The FFI API minor version to speak with the XLA that built `frame`: its
 * own, at most HCB_FFI_API_MINOR.  XLA passes its XLA_FFI_Api in every call
 * frame, the metadata probe's included, from FFI 0.2 on; FFI 0.1 (JAX 0.6
 * and 0.7) leaves the probe's NULL. */
static inline int
hcb_ffi_frame_minor(const XLA_FFI_CallFrame *frame)
{
    const XLA_FFI_Api *api = frame->api;

    if (api == NULL)
        return HCB_FFI_API_MINOR_OLDEST;
    if (api->api_version.major_version != HCB_FFI_API_MAJOR ||
        api->api_version.minor_version > HCB_FFI_API_MINOR)
        return HCB_FFI_API_MINOR;
    if (api->api_version.minor_version < HCB_FFI_API_MINOR_OLDEST)
        return HCB_FFI_API_MINOR_OLDEST;
    return api->api_version.minor_version;
}

/* XLA_FFI_Metadata as FFI 0.2 on lays it out: 0.1's three fields, then the
 * type of a stateful handler's state, which 0.1 lacks. */
typedef struct {
    size_t struct_size;
    XLA_FFI_Api_Version api_version;
    XLA_FFI_Handler_Traits traits;
    XLA_FFI_TypeId state_type_id; /* FFI 0.2 on */
} hcb_ffi_metadata;

/* XLA_FFI_TypeInfo (FFI 0.2 on): how XLA frees a state of a registered type
 * (jax.ffi.register_ffi_type).  FFI 0.1 registers a bare type id
 * (jax.ffi.register_ffi_type_id) and takes the deleter with each state. */
typedef struct {
    size_t struct_size;
    void *extension_start;
    void (*deleter)(void *object);
} hcb_ffi_type_info;

#if XLA_FFI_API_MAJOR == 0 && XLA_FFI_API_MINOR >= 2
#ifdef __cplusplus
#define HCB_FFI_LAYOUT_CHECK static_assert
#else
#define HCB_FFI_LAYOUT_CHECK _Static_assert
#endif
HCB_FFI_LAYOUT_CHECK(offsetof(hcb_ffi_metadata, state_type_id) ==
                         offsetof(XLA_FFI_Metadata, state_type_id),
                     "hcb_ffi_metadata is XLA_FFI_Metadata's layout");
HCB_FFI_LAYOUT_CHECK(sizeof(hcb_ffi_type_info) == sizeof(XLA_FFI_TypeInfo),
                     "hcb_ffi_type_info is XLA_FFI_TypeInfo's layout");
#undef HCB_FFI_LAYOUT_CHECK
#endif

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

/* Answers XLA's registration-time metadata probe for a handler whose
 * INSTANTIATE stage sets a state of type `state_type` (NULL: stateless, as
 * every handler but one).  It returns true when `frame` was the probe (it
 * has filled the metadata; return NULL), false for a real call.  `traits`
 * is a mask of XLA_FFI_HANDLER_TRAITS_* (0 for a handler that must not be
 * captured in a command buffer). */
static inline bool
hcb_ffi_answer_probe_stateful(XLA_FFI_CallFrame *frame,
                              XLA_FFI_Handler_Traits traits,
                              const XLA_FFI_TypeId *state_type)
{
    hcb_ffi_extension *ext = frame->extension_start;
    hcb_ffi_metadata *md;
    int minor;

    if (ext == NULL || ext->type != XLA_FFI_Extension_Metadata)
        return false;
    md = (hcb_ffi_metadata *)((XLA_FFI_Metadata_Extension *)ext)->metadata;
    minor = hcb_ffi_frame_minor(frame);
    md->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    md->api_version.extension_start = NULL;
    md->api_version.major_version = HCB_FFI_API_MAJOR;
    md->api_version.minor_version = minor;
    md->traits = traits;
    /* state_type_id lies past the struct_size XLA gives (its traits stop at
     * `traits`), but XLA from 0.2 on allocates the whole struct; zero means
     * stateless.  0.1's has no such field. */
    if (minor >= 2)
        md->state_type_id.type_id = state_type ? state_type->type_id : 0;
    return true;
}

/* The probe of a stateless handler.  Call it first in every handler. */
static inline bool
hcb_ffi_answer_probe(XLA_FFI_CallFrame *frame, XLA_FFI_Handler_Traits traits)
{
    return hcb_ffi_answer_probe_stateful(frame, traits, NULL);
}

/* Sets the INSTANTIATE state of the executable that `frame` runs in:
 * `state`, of the registered type `type_id`, which XLA frees with `deleter`
 * when it destroys the executable (FFI 0.1 takes the deleter with each
 * state; from 0.2 XLA uses the type's, hcb_ffi_type_info, and `deleter` is
 * the caller's to keep equal to it).  Call it from the INSTANTIATE stage.
 * On an error XLA keeps nothing: the state is the caller's to free. */
static inline XLA_FFI_Error *
hcb_ffi_state_set(XLA_FFI_CallFrame *frame, XLA_FFI_TypeId *type_id,
                  void *state, void (*deleter)(void *))
{
    /* XLA_FFI_State_Set_Args in each layout, after the three fields all
     * share: 0.2 dropped 0.1's deleter, 0.3 added the stage. */
    typedef struct {
        size_t struct_size;
        void *extension_start;
        XLA_FFI_ExecutionContext *ctx;
    } head;
    struct {
        head h;
        XLA_FFI_TypeId *type_id;
        void *state;
        void (*deleter)(void *);
    } v1 = {{sizeof v1, NULL, frame->ctx}, type_id, state, deleter};
    struct {
        head h;
        XLA_FFI_TypeId *type_id;
        void *state;
    } v2 = {{sizeof v2, NULL, frame->ctx}, type_id, state};
    struct {
        head h;
        XLA_FFI_ExecutionStage stage;
        XLA_FFI_TypeId *type_id;
        void *state;
    } v3 = {{sizeof v3, NULL, frame->ctx},
            XLA_FFI_ExecutionStage_INSTANTIATE,
            type_id,
            state};
    int minor = hcb_ffi_frame_minor(frame);
    void *args = minor == 1 ? (void *)&v1 : minor == 2 ? (void *)&v2 : &v3;

    return frame->api->XLA_FFI_State_Set((XLA_FFI_State_Set_Args *)args);
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HCB_FFI_VERSION_H */
