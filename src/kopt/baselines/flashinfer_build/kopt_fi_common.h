// Shared by kopt's C ABI around FlashInfer's batch decode: export macro, the error string, CUDA checks.
#pragma once
#include <cuda_runtime.h>

#include <string>

#define KOPT_FI_EXPORT __attribute__((visibility("default")))

// The last error of this thread (what kopt_fi_last_error returns).
void kopt_fi_set_error(const std::string& message);

#define KOPT_FI_CUDA(call)                                                                  \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      kopt_fi_set_error(std::string(#call " failed: ") + cudaGetErrorString(e_));           \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)
