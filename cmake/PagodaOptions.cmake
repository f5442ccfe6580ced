# Warnings, sanitizers and the version string shared by every target.

set(PAGODA_SANITIZE "" CACHE STRING "Sanitizer to build with: address, undefined, thread or empty")
set_property(CACHE PAGODA_SANITIZE PROPERTY STRINGS "" address undefined thread)

add_library(pagoda_options INTERFACE)
target_compile_options(pagoda_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>)
target_compile_definitions(pagoda_options INTERFACE
  PAGODA_VERSION="${PROJECT_VERSION}")

if(PAGODA_SANITIZE)
  if(NOT PAGODA_SANITIZE MATCHES "^(address|undefined|thread)$")
    message(FATAL_ERROR "PAGODA_SANITIZE must be address, undefined or thread; got '${PAGODA_SANITIZE}'")
  endif()
  set(_san -fsanitize=${PAGODA_SANITIZE} -fno-omit-frame-pointer)
  if(PAGODA_SANITIZE STREQUAL "undefined")
    list(APPEND _san -fno-sanitize-recover=undefined)
  endif()
  target_compile_options(pagoda_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${_san}>)
  target_link_options(pagoda_options INTERFACE ${_san})
endif()
