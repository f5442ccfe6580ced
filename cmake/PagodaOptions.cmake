# Warnings, sanitizers and the version string shared by every target.

set(PAGODA_SANITIZE "" CACHE STRING
    "Sanitizers to build with: address, undefined, thread, address,undefined or empty")
set_property(CACHE PAGODA_SANITIZE PROPERTY STRINGS "" address undefined thread "address,undefined")
option(PAGODA_FUZZ "Build the libFuzzer targets (clang): coverage instrumentation on every target" OFF)

add_library(pagoda_options INTERFACE)
target_compile_options(pagoda_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>)
target_compile_definitions(pagoda_options INTERFACE
  PAGODA_VERSION="${PROJECT_VERSION}")

if(PAGODA_SANITIZE)
  if(NOT PAGODA_SANITIZE MATCHES "^(address|undefined|thread|address,undefined)$")
    message(FATAL_ERROR
            "PAGODA_SANITIZE must be address, undefined, thread or address,undefined; got '${PAGODA_SANITIZE}'")
  endif()
  set(_san -fsanitize=${PAGODA_SANITIZE} -fno-omit-frame-pointer)
  if(PAGODA_SANITIZE MATCHES "undefined")
    list(APPEND _san -fno-sanitize-recover=undefined)
  endif()
  target_compile_options(pagoda_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${_san}>)
  target_link_options(pagoda_options INTERFACE ${_san})
endif()

if(PAGODA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "PAGODA_FUZZ needs clang (libFuzzer); configure with CXX=clang++")
  endif()
  target_compile_options(pagoda_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()
