#pragma once
// Skips the current test where no CUDA device answers (build machines: the
// runtime finds only a stub driver and returns cudaErrorInsufficientDriver).

#include <gtest/gtest.h>

#include "pagoda/backend.h"

#define PAGODA_SKIP_WITHOUT_CUDA_DEVICE()                                                  \
  do {                                                                                     \
    if (!::pagoda::cuda_device_available())                                                \
      GTEST_SKIP() << "no usable CUDA device (cudaGetDeviceCount found none or no driver)"; \
  } while (0)
