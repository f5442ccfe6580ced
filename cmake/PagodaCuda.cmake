# PAGODA_CUDA = AUTO | ON | OFF.
# AUTO builds the CUDA backend when nvcc is found; without it the backend factory
# answers "built without CUDA". ON fails the configure when nvcc is missing.

set(PAGODA_CUDA "AUTO" CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE PAGODA_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${PAGODA_CUDA}" _pagoda_cuda)
if(NOT _pagoda_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "PAGODA_CUDA must be AUTO, ON or OFF; got '${PAGODA_CUDA}'")
endif()

set(PAGODA_WITH_CUDA OFF)
if(NOT _pagoda_cuda STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    # Hopper (the deployment target, with its architecture-specific features) and Ampere.
    set(CMAKE_CUDA_ARCHITECTURES "90a;80")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    # CMake 3.25 knows no C++20 flag for nvcc (it came with 3.26); nvcc 12+ takes it.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(PAGODA_WITH_CUDA ON)
  elseif(_pagoda_cuda STREQUAL "ON")
    message(FATAL_ERROR "PAGODA_CUDA=ON but no CUDA compiler was found (looked for nvcc on PATH and /usr/local/cuda/bin/nvcc)")
  endif()
endif()
message(STATUS "pagoda: CUDA backend ${PAGODA_WITH_CUDA} (PAGODA_CUDA=${PAGODA_CUDA})")
