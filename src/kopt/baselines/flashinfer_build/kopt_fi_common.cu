// The plan half of kopt's C ABI around FlashInfer's batch decode: FlashInfer's own scheduler
// (include/flashinfer/attention/scheduler.cuh, PrefillPlan), called as csrc/batch_prefill.cu's
// BatchPrefillWithKVCachePlan calls it for BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True).
#include <flashinfer/attention/scheduler.cuh>

#include <cstdint>
#include <exception>
#include <string>

#include "kopt_fi_common.h"

#ifndef KOPT_FI_VERSION
#define KOPT_FI_VERSION "unknown"
#endif
#ifndef KOPT_FI_VARIANTS
#define KOPT_FI_VARIANTS ""
#endif

#include <sys/random.h>

// The static libstdc++ of a glibc >= 2.36 build system refers to arc4random (std::random_device, which nothing
// here calls): a local definition keeps the library loadable on glibc 2.35 hosts (it still needs >= 2.35).
extern "C" __attribute__((visibility("hidden"))) uint32_t arc4random(void) {
  uint32_t r = 0;
  if (getrandom(&r, sizeof(r), 0) != sizeof(r)) r = 0;
  return r;
}

static thread_local std::string kopt_fi_error;

void kopt_fi_set_error(const std::string& message) { kopt_fi_error = message; }

extern "C" KOPT_FI_EXPORT const char* kopt_fi_last_error() { return kopt_fi_error.c_str(); }

// The FlashInfer release the kernels were built from, e.g. "0.7.2.post1".
extern "C" KOPT_FI_EXPORT const char* kopt_fi_version() { return KOPT_FI_VERSION; }

// Comma-separated variants in this build, e.g. "f16_d64,f16_d128,bf16_d64,bf16_d128".
extern "C" KOPT_FI_EXPORT const char* kopt_fi_variants() { return KOPT_FI_VARIANTS; }

// The CUDA runtime version this library was linked against (static), e.g. 13000.
extern "C" KOPT_FI_EXPORT int kopt_fi_cudart_version() { return CUDART_VERSION; }

// Number of CUDA devices this library's runtime sees (0 on a machine without a GPU); -1 on error.
extern "C" KOPT_FI_EXPORT int kopt_fi_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : -1;
}

// FlashInfer's plan for a decode batch (one query row per request): fills plan_info[15]
// (PrefillPlanInfo::ToVector) and copies the scheduler's int arrays to int_workspace on `stream`,
// from the page-locked host buffer, then waits for that copy (plan is outside the timed call).
// qo_indptr_h / kv_indptr_h are host arrays of batch_size + 1; kv_indptr_h counts pages.
extern "C" KOPT_FI_EXPORT int kopt_fi_plan(
    void* float_workspace, size_t float_workspace_bytes, void* int_workspace,
    void* page_locked_int_workspace, size_t int_workspace_bytes, const int32_t* qo_indptr_h,
    const int32_t* kv_indptr_h, int64_t batch_size, int64_t num_qo_heads, int64_t num_kv_heads,
    int64_t head_dim, int64_t page_size, int enable_cuda_graph, int64_t fixed_split_size,
    int disable_split_kv, int device, void* stream, int64_t* plan_info) {
  try {
    KOPT_FI_CUDA(cudaSetDevice(device));
    auto s = static_cast<cudaStream_t>(stream);
    flashinfer::PrefillPlanInfo info;
    cudaError_t status = flashinfer::PrefillPlan<int32_t>(
        float_workspace, float_workspace_bytes, int_workspace, page_locked_int_workspace,
        int_workspace_bytes, info, const_cast<int32_t*>(qo_indptr_h),
        const_cast<int32_t*>(kv_indptr_h), /*total_num_rows=*/batch_size, batch_size, num_qo_heads,
        num_kv_heads, head_dim, head_dim, page_size, enable_cuda_graph != 0,
        /*sizeof_dtype_o=*/2, /*window_left=*/-1, fixed_split_size, disable_split_kv != 0,
        /*num_colocated_ctas=*/0, /*uniform_q_len=*/0, s, /*kv_dtype_bytes=*/2);
    if (status != cudaSuccess) {
      kopt_fi_set_error(std::string("PrefillPlan failed: ") + cudaGetErrorString(status));
      return 1;
    }
    KOPT_FI_CUDA(cudaStreamSynchronize(s));
    std::vector<int64_t> v = info.ToVector();
    for (size_t i = 0; i < v.size(); ++i) plan_info[i] = v[i];
    return 0;
  } catch (const std::exception& e) {
    kopt_fi_set_error(e.what());
    return 1;
  }
}
