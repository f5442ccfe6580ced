# Warnings, sanitizers and the version string shared by every target.

set(PAGODA_SANITIZE "" CACHE STRING
    "Sanitizers to build with: address, undefined, thread, address,undefined or empty")
set_property(CACHE PAGODA_SANITIZE PROPERTY STRINGS "" address undefined thread "address,undefined")
option(PAGODA_FUZZ "Build the libFuzzer targets (clang), with coverage on the code requests reach (fuzz/)" OFF)
option(PAGODA_RUNNABLE_SIMD_ONLY
       "Compile the kernels only for the SIMD targets this machine runs (test builds; kernels/cpu)" OFF)

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
  # A sanitizer build is for its checks, and its compile dominates CI: line
  # tables are all a report's file:line needs, and code compiles at -O0 but for
  # the targets that set PAGODA_OPTIMIZE_UNDER_SANITIZERS: the kernels, the
  # cache and the kernel tests with their oracle, whose cases run real shapes
  # (the cache manager at -O0 took most of a small case's time). At -O0 a
  # gRPC-heavy source took about 0.4x the core time of -O2.
  set(_optimize $<BOOL:$<TARGET_PROPERTY:PAGODA_OPTIMIZE_UNDER_SANITIZERS>>)
  set(_san_compile ${_san} -g1 $<IF:${_optimize},-O2,-O0>)
  target_compile_options(pagoda_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${_san_compile}>)
  target_link_options(pagoda_options INTERFACE ${_san})
endif()

if(PAGODA_FUZZ AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "PAGODA_FUZZ needs clang (libFuzzer); configure with CXX=clang++")
endif()
