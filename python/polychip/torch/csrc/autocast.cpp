// Autocast for the polychip device (PyTorch's AutocastPrivateUse1 key):
// PyTorch's own policy lists, as it applies them to CUDA: matmuls and
// attention in the lower precision, reductions, norms and losses in f32,
// mixed inputs promoted; every other operator passes through.
//
// A translation unit of its own: the policy macros instantiate a kernel per
// operator, and ninja compiles this beside backend.cpp.

#include <ATen/autocast_mode.h>
#include <torch/library.h>

// Inside at::autocast, as PyTorch's own registrations are, so the policy
// lists' type names resolve.
namespace at::autocast {
namespace {

#define ADD_NS(RAW_OP) at::RAW_OP
#define POLYCHIP_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define POLYCHIP_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define POLYCHIP_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define POLYCHIP_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(POLYCHIP_LOWER)
  AT_FORALL_FP32(POLYCHIP_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(POLYCHIP_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(POLYCHIP_PROMOTE)
}

}  // namespace
}  // namespace at::autocast
