// IFEC_CUDA_CHECK: turns a failed CUDA runtime call into an ifec::common::Error naming the call and the error.
#pragma once

#include <cuda_runtime.h>

#include "ifec/common/checks.h"

#define IFEC_CUDA_CHECK(expr)                                                                       \
  do {                                                                                              \
    const cudaError_t ifec_cuda_err_ = (expr);                                                      \
    IFEC_CHECK(ifec_cuda_err_ == cudaSuccess, #expr << ": " << cudaGetErrorString(ifec_cuda_err_)); \
  } while (0)
