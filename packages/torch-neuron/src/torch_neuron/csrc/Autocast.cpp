// torch.autocast("neuron"): the same cast policy as CUDA's (matmuls/convolutions in the autocast
// dtype, precision-sensitive ops in float32, mixed inputs promoted), over PyTorch's own op lists.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace torch_neuron {
namespace {

using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;
using at::autocast::CastPolicy;

#define NEURON_LOWER(op, ...) KERNEL_PRIVATEUSEONE(op, ##__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(op, ...) KERNEL_PRIVATEUSEONE(op, ##__VA_ARGS__, fp32)
#define NEURON_FP32_DTYPE(op, ...) KERNEL_PRIVATEUSEONE(op, ##__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_PROMOTE(op, ...) KERNEL_PRIVATEUSEONE(op, ##__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)
}

}  // namespace
}  // namespace torch_neuron
