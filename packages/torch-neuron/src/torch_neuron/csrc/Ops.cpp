// What must be C++ among the aten ops: allocation, metadata/view kernels, resize/set, and the
// boxed CPU fallback. All compute is registered from Python (torch_neuron.ops) on the HAL.
#include "Runtime.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torch_neuron {
namespace {

constexpr c10::DispatchKeySet kNeuronKeys{c10::DispatchKey::PrivateUse1};

c10::Device target(std::optional<c10::Device> device) {
  c10::Device d = device.value_or(c10::Device(c10::DeviceType::PrivateUse1, current_device()));
  TORCH_CHECK(d.is_privateuseone(), "expected a neuron device, got ", d);
  return d.has_index() ? d : c10::Device(c10::DeviceType::PrivateUse1, current_device());
}

void check_layout(std::optional<c10::Layout> layout) {
  TORCH_CHECK_NOT_IMPLEMENTED(c10::layout_or_default(layout) == c10::Layout::Strided,
                              "neuron tensors are strided; layout ", c10::layout_or_default(layout),
                              " is not supported");
}

at::Tensor empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                 std::optional<c10::Device> device, std::optional<bool> /*pin_memory*/,
                 std::optional<c10::MemoryFormat> memory_format) {
  check_layout(layout);
  c10::Device d = target(device);
  check_device(d.index());
  c10::DeviceGuard guard(d);
  return at::detail::empty_generic(size, allocator(), kNeuronKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> /*pin_memory*/) {
  check_layout(layout);
  c10::Device d = target(device);
  check_device(d.index());
  c10::DeviceGuard guard(d);
  return at::detail::empty_strided_generic(size, stride, allocator(), kNeuronKeys, c10::dtype_or_default(dtype));
}

// Make sure `self`'s storage holds `size`/`stride` from `offset` elements, growing it if needed.
void ensure_storage(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride, int64_t offset) {
  int64_t needed = 0;
  if (c10::multiply_integers(size) > 0) {
    needed = offset + 1;
    for (size_t i = 0; i < size.size(); ++i) needed += (size[i] - 1) * stride[i];
  }
  size_t bytes = static_cast<size_t>(needed) * self.dtype().itemsize();
  const c10::Storage& storage = self.unsafeGetTensorImpl()->unsafe_storage();
  if (bytes > storage.nbytes()) resize_storage_bytes(storage, bytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  auto format = memory_format.value_or(c10::MemoryFormat::Contiguous);
  impl->set_sizes_contiguous(size);
  if (format != c10::MemoryFormat::Contiguous && format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(format);
  }
  ensure_storage(self, impl->sizes(), impl->strides(), impl->storage_offset());
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().is_privateuseone(), "set_: expected neuron storage, got ", source.device());
  auto* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  c10::DimVector strides = stride.empty() ? c10::contiguous_strides(size) : c10::DimVector(stride);
  impl->set_sizes_and_strides(size, strides, offset);
  ensure_storage(self, size, strides, offset);
  return self;
}

at::Tensor& set_source(at::Tensor& self, c10::Storage source) {
  int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, allocator(), /*resizable=*/true);
  return set_storage(self, std::move(storage), 0, {0}, {});
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  std::string name = schema.operator_name().name.substr(6);  // drop "aten::"
  if (!schema.overload_name().empty()) name += "." + schema.overload_name();
  {
    py::gil_scoped_acquire gil;
    try {
      runtime()->fallback(name);
    } catch (py::error_already_set& e) {  // strict mode: the op must not leave the device
      std::string message = py::str(e.value());
      TORCH_CHECK_NOT_IMPLEMENTED(false, message);
    }
  }
  at::native::cpu_fallback(op, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_", set_empty);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

}  // namespace torch_neuron
