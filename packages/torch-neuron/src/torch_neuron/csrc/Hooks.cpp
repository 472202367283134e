// PrivateUse1 hooks: what torch.accelerator, default generators, pinned memory and storage resize
// ask of a backend.
#include "Generator.h"
#include "Runtime.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>

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
  // Host memory needs no pinning for HAL transfers; pinned requests get ordinary CPU memory.
  bool isPinnedPtr(const void* /*data*/) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage_bytes(storage, nbytes);
  }
};

struct Register {
  Register() { at::RegisterPrivateUse1HooksInterface(new NeuronHooks()); }
} register_hooks;

}  // namespace
}  // namespace torch_neuron
