# hcbConfig.cmake - find_package(hcb) for libhcb, the C runtime of the
# host_callback package.
#
#   find_package(hcb CONFIG REQUIRED)   # hcb_DIR: python -m host_callback --cmakedir
#   target_link_libraries(app PRIVATE hcb::hcb)      # hcb/hcb.h
#   target_link_libraries(handlers PRIVATE hcb::ffi) # also hcb/ffi.h
#
# hcb::ffi adds the XLA FFI headers (xla/ffi/api/c_api.h) that jaxlib ships:
# from HCB_XLA_INCLUDE_DIR if set, else from the jaxlib installed next to
# this package, else from `jax.ffi.include_dir()` of the Python found.
get_filename_component(_hcb_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.."
                       ABSOLUTE)

if(NOT TARGET hcb::hcb)
  add_library(hcb::hcb SHARED IMPORTED)
  set_target_properties(hcb::hcb PROPERTIES
    IMPORTED_LOCATION "${_hcb_prefix}/lib/libhcb.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_hcb_prefix}/include")
endif()

if(NOT TARGET hcb::ffi)
  if(NOT HCB_XLA_INCLUDE_DIR AND
     EXISTS "${_hcb_prefix}/../jaxlib/include/xla/ffi/api/c_api.h")
    get_filename_component(HCB_XLA_INCLUDE_DIR
                           "${_hcb_prefix}/../jaxlib/include" ABSOLUTE)
  endif()
  if(NOT HCB_XLA_INCLUDE_DIR)
    find_package(Python COMPONENTS Interpreter QUIET)
    if(Python_EXECUTABLE)
      execute_process(
        COMMAND "${Python_EXECUTABLE}" -c
                "import jax.ffi; print(jax.ffi.include_dir())"
        OUTPUT_VARIABLE HCB_XLA_INCLUDE_DIR
        OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    endif()
  endif()
  if(HCB_XLA_INCLUDE_DIR AND
     EXISTS "${HCB_XLA_INCLUDE_DIR}/xla/ffi/api/c_api.h")
    add_library(hcb::ffi INTERFACE IMPORTED)
    set_target_properties(hcb::ffi PROPERTIES
      INTERFACE_LINK_LIBRARIES hcb::hcb
      INTERFACE_INCLUDE_DIRECTORIES "${HCB_XLA_INCLUDE_DIR}")
  elseif(NOT hcb_FIND_QUIETLY)
    message(WARNING "hcb: no XLA FFI headers (xla/ffi/api/c_api.h), so no "
                    "hcb::ffi target: install jaxlib or set "
                    "HCB_XLA_INCLUDE_DIR")
  endif()
endif()

set(hcb_INCLUDE_DIRS "${_hcb_prefix}/include")
set(hcb_LIBRARIES hcb::hcb)
unset(_hcb_prefix)
