// One FlashInfer batch-decode variant (dtype, head dim) behind a plain C ABI: the run half of
// FlashInfer's csrc/batch_prefill_paged.cuh (BatchPrefillWithPagedKVCacheRun), which is what
// BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True).run() calls, with raw device pointers
// in place of tvm-ffi tensors. Compiled once per variant by build.py with
//   -DKOPT_FI_SUFFIX=f16_d128 -I<gen dir of that variant>
// where the gen dir holds FlashInfer's own templates rendered as its JIT renders them
// (batch_prefill_config.inc, batch_prefill_paged_kernel_mask_0.cu).
#include <cstdint>
#include <exception>

#define KOPT_CAT2(a, b) a##b
#define KOPT_CAT(a, b) KOPT_CAT2(a, b)
// Each variant's parameter structs get their own names: one shared library holds all variants, and
// the host-side template instantiations on PagedParams must not collide across them.
#define PagedParams KOPT_CAT(PagedParams_, KOPT_FI_SUFFIX)
#define RaggedParams KOPT_CAT(RaggedParams_, KOPT_FI_SUFFIX)

// As csrc/batch_prefill.cu begins: the mask modes, the scheduler's PrefillPlanInfo, positional encodings.
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/pos_enc.cuh>

// FlashInfer's explicit instantiations (non-causal mask, CTA_TILE_Q 16/64/128, equal K/V strides).
#include "batch_prefill_paged_kernel_mask_0.cu"

#include "kopt_fi_common.h"

using namespace flashinfer;

extern "C" KOPT_FI_EXPORT int KOPT_CAT(kopt_fi_run_, KOPT_FI_SUFFIX)(
    void* float_workspace, void* int_workspace, const int64_t* plan_info_vec, void* q,
    int64_t q_stride_n, int64_t q_stride_h, void* k_cache, void* v_cache, const int64_t* k_strides,
    const int64_t* v_strides, int32_t* qo_indptr, int32_t* kv_indptr, int32_t* kv_indices,
    int32_t* kv_last_page_len, void* o, float* lse, int64_t batch_size, int64_t num_qo_heads,
    int64_t num_kv_heads, int64_t page_size, double sm_scale, int enable_pdl, int device,
    void* stream) {
  try {
    KOPT_FI_CUDA(cudaSetDevice(device));
    PrefillPlanInfo plan_info;
    plan_info.FromVector(std::vector<int64_t>(plan_info_vec, plan_info_vec + 15));
    for (int i = 0; i < 4; ++i) {
      if (k_strides[i] != v_strides[i]) {
        kopt_fi_set_error("k_cache and v_cache strides differ (this build has equal-stride kernels only)");
        return 1;
      }
    }
    PagedParams params;
    params.q = static_cast<DTypeQ*>(q);
    params.paged_kv = paged_kv_t<DTypeKV, IdType>(
        num_kv_heads, page_size, HEAD_DIM_VO, batch_size, QKVLayout::kNHD,
        static_cast<DTypeKV*>(k_cache), static_cast<DTypeKV*>(v_cache), k_strides, v_strides,
        kv_indices, kv_indptr, kv_last_page_len);
    params.q_indptr = qo_indptr;
    params.o = static_cast<DTypeO*>(o);
    params.lse = lse;
    params.num_qo_heads = num_qo_heads;
    params.group_size = uint_fastdiv(num_qo_heads / num_kv_heads);
    params.q_stride_n = q_stride_n;
    params.q_stride_h = q_stride_h;
    params.window_left = -1;
    // The fa2 additional parameters, as the Python run() passes them for pos_encoding_mode NONE,
    // no custom mask, no soft cap (rope_scale 1, rope_theta 1e4).
    params.maybe_custom_mask = nullptr;
    params.maybe_mask_indptr = nullptr;
    params.maybe_alibi_slopes = nullptr;
    params.maybe_prefix_len_ptr = nullptr;
    params.maybe_token_pos_in_items_ptr = nullptr;
    params.maybe_max_item_len_ptr = nullptr;
    params.maybe_k_cache_sf = nullptr;
    params.maybe_v_cache_sf = nullptr;
    params.logits_soft_cap = 0.0;
    params.sm_scale = sm_scale;
    params.rope_rcp_scale = 1.0;
    params.rope_rcp_theta = 1.0 / 1e4;
    params.token_pos_in_items_len = 0;
    params.k_sf_stride_page = params.k_sf_stride_n = params.k_sf_stride_h = 0;
    params.v_sf_stride_page = params.v_sf_stride_n = params.v_sf_stride_h = 0;

    params.request_indices = GetPtrFromBaseOffset<IdType>(int_workspace, plan_info.request_indices_offset);
    params.qo_tile_indices = GetPtrFromBaseOffset<IdType>(int_workspace, plan_info.qo_tile_indices_offset);
    params.kv_tile_indices = GetPtrFromBaseOffset<IdType>(int_workspace, plan_info.kv_tile_indices_offset);
    params.o_indptr = GetPtrFromBaseOffset<IdType>(int_workspace, plan_info.o_indptr_offset);
    params.kv_chunk_size_ptr = GetPtrFromBaseOffset<IdType>(int_workspace, plan_info.kv_chunk_size_ptr_offset);
    params.merge_indptr = nullptr;
    params.block_valid_mask = nullptr;
    params.total_num_rows = nullptr;
    params.partition_kv = false;
    DTypeO* tmp_v = nullptr;
    float* tmp_s = nullptr;
    if (plan_info.split_kv) {
      params.merge_indptr = GetPtrFromBaseOffset<IdType>(int_workspace, plan_info.merge_indptr_offset);
      tmp_v = GetPtrFromBaseOffset<DTypeO>(float_workspace, plan_info.v_offset);
      tmp_s = GetPtrFromBaseOffset<float>(float_workspace, plan_info.s_offset);
    }
    params.padded_batch_size = plan_info.padded_batch_size;
    params.max_total_num_rows = plan_info.total_num_rows;
    if (plan_info.enable_cuda_graph) {
      params.block_valid_mask = GetPtrFromBaseOffset<bool>(int_workspace, plan_info.block_valid_mask_offset);
      params.total_num_rows = GetPtrFromBaseOffset<uint32_t>(int_workspace, plan_info.total_num_rows_offset);
    }

    cudaError_t status = cudaSuccess;
    auto s = static_cast<cudaStream_t>(stream);
    // The CTA tiles the kernel-instantiation template instantiates for head dims below 512.
    switch (plan_info.cta_tile_q) {
#define KOPT_FI_TILE(T)                                                                         \
  case T:                                                                                       \
    status = BatchPrefillWithPagedKVCacheDispatched<true, T, HEAD_DIM_QK, HEAD_DIM_VO,          \
                                                    POS_ENCODING_MODE, USE_FP16_QK_REDUCTION,   \
                                                    MaskMode::kNone, DefaultAttention<false, false, false, false>, \
                                                    PagedParams>(params, tmp_v, tmp_s, enable_pdl != 0, s); \
    break;
      KOPT_FI_TILE(16)
      KOPT_FI_TILE(64)
      KOPT_FI_TILE(128)
#undef KOPT_FI_TILE
      default:
        kopt_fi_set_error("unsupported cta_tile_q " + std::to_string(plan_info.cta_tile_q));
        return 1;
    }
    if (status != cudaSuccess) {
      kopt_fi_set_error(std::string("BatchPrefillWithPagedKVCache failed: ") + cudaGetErrorString(status));
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    kopt_fi_set_error(e.what());
    return 1;
  }
}
