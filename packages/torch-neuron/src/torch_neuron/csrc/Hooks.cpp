// PrivateUse1 hooks: what torch.accelerator, default generators, pinned memory and storage resize
// ask of a backend; backend metadata for serialization.
#include "Generator.h"
#include "PinnedMemory.h"
#include "Runtime.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

namespace torch_neuron {
namespace {

struct NeuronHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return runtime() != nullptr && runtime()->device_count > 0; }
  bool hasPrimaryContext(c10::DeviceIndex device) const override {
    return runtime() != nullptr && device >= 0 && device < runtime()->device_count;
  }
  c10::DeviceIndex deviceCount() const override { return runtime() == nullptr ? 0 : runtime()->device_count; }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_current_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = current_device();
    set_current_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return default_generator(device);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    return at::make_generator<NeuronGenerator>(device < 0 ? current_device() : device);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    py::gil_scoped_acquire gil;
    auto index = runtime()->device_of(reinterpret_cast<uintptr_t>(data)).cast<int>();
    TORCH_CHECK(index >= 0, "address ", data, " is not neuron device memory");
    return {c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)};
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage_bytes(storage, nbytes);
  }
};

// torch._utils.set_tensor_metadata / torch.load: neuron tensors carry no backend metadata, so a key beyond
// torch's own conj/neg is an error naming it rather than silently dropped.
void no_backend_meta(const at::Tensor& /*t*/, std::unordered_map<std::string, bool>& /*metadata*/) {}
void refuse_backend_meta(const at::Tensor& /*t*/, std::unordered_map<std::string, bool>& metadata) {
  if (metadata.empty()) return;
  std::string keys;
  for (const auto& kv : metadata) keys += (keys.empty() ? "'" : ", '") + kv.first + "'";
  TORCH_CHECK(false, "set_tensor_metadata: neuron tensors carry no backend metadata (only torch's 'conj' and "
              "'neg'); got ", keys);
}

struct Register {
  Register() {
    at::RegisterPrivateUse1HooksInterface(new NeuronHooks());
    torch::jit::TensorBackendMetaRegistry(c10::DeviceType::PrivateUse1, &no_backend_meta, &refuse_backend_meta);
  }
} register_hooks;

}  // namespace
}  // namespace torch_neuron
