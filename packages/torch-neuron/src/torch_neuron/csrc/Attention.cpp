// scaled_dot_product_attention picks its backend through the _fused_sdp_choice DispatchStub, which has no
// Python entry: registering its PrivateUse1 slot is the only way for a backend to get the fused
// (overrideable) path. The decision itself is Python (torch_neuron.ops.attention.sdp_choice), next to the
// kernels whose limits it encodes.
#include <ATen/native/transformers/attention.h>
#include <torch/extension.h>

namespace torch_neuron {
namespace {

int64_t sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                   const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                   std::optional<double> scale, bool enable_gqa) {
  py::gil_scoped_acquire gil;
  try {
    py::object choose = py::module_::import("torch_neuron.ops.attention").attr("sdp_choice");
    return choose(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa).cast<int64_t>();
  } catch (py::error_already_set& e) {
    TORCH_CHECK(false, "neuron scaled_dot_product_attention backend choice failed: ", e.what());
  }
}

}  // namespace
}  // namespace torch_neuron

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_neuron::sdp_choice)
}  // namespace at::native
