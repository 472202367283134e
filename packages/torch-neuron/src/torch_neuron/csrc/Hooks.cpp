// PrivateUse1 hooks: what torch.accelerator, default generators, pinned memory and storage resize
// ask of a backend; backend metadata (flags that travel with a tensor through serialization).
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

// torch._utils.set_tensor_metadata / get_tensor_metadata: a neuron tensor carries the boolean flags set on it
// (beyond torch's own 'conj' and 'neg', which torch keeps itself) in its TensorImpl's backend metadata, so they
// travel where torch copies that metadata: torch.save/torch.load, torch._C._copy_backend_meta, fake tensors
// (torch.compile's example values). Views and new results start without flags, as on every backend.
struct NeuronBackendMeta final : c10::BackendMeta {
  explicit NeuronBackendMeta(std::unordered_map<std::string, bool> f) : flags(std::move(f)) {}
  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>& /*ptr*/) const override {
    return c10::make_intrusive<NeuronBackendMeta>(flags);
  }
  std::unordered_map<std::string, bool> flags;
};

void get_backend_meta(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  auto* meta = dynamic_cast<NeuronBackendMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
  if (meta != nullptr) metadata.insert(meta->flags.begin(), meta->flags.end());
}

// set replaces the flags (an empty map clears them; torch.load passes one for a tensor saved without flags).
void set_backend_meta(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  auto* impl = t.unsafeGetTensorImpl();
  if (metadata.empty()) {
    if (impl->get_backend_meta() != nullptr) impl->set_backend_meta(nullptr);
    return;
  }
  impl->set_backend_meta(c10::make_intrusive<NeuronBackendMeta>(metadata));
}

struct Register {
  Register() {
    at::RegisterPrivateUse1HooksInterface(new NeuronHooks());
    torch::jit::TensorBackendMetaRegistry(c10::DeviceType::PrivateUse1, &get_backend_meta, &set_backend_meta);
  }
} register_hooks;

}  // namespace
}  // namespace torch_neuron
