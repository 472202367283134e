#include "Generator.h"
#include "Runtime.h"

#include <ATen/Utils.h>
#include <c10/core/TensorImpl.h>
#include <mutex>

namespace torch_neuron {

NeuronGenerator::NeuronGenerator(c10::DeviceIndex device)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

void NeuronGenerator::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

uint64_t NeuronGenerator::seed() {
  set_current_seed(c10::detail::getNonDeterministicRandom());
  return seed_;
}

void NeuronGenerator::set_state(const c10::TensorImpl& state) {
  TORCH_CHECK(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && state.numel() == 16 &&
                  state.device().is_cpu(),
              "neuron generator state must be a CPU uint8 tensor of 16 bytes (seed, offset), got ",
              state.numel(), " elements of ", state.dtype().name(), " on ", state.device());
  const auto* bytes = static_cast<const uint64_t*>(state.data());
  seed_ = bytes[0];
  offset_ = bytes[1];
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGenerator::get_state() const {
  auto state = at::detail::empty_cpu({16}, at::ScalarType::Byte, std::nullopt, std::nullopt,
                                     std::nullopt, std::nullopt);
  auto* bytes = static_cast<uint64_t*>(state.data_ptr());
  bytes[0] = seed_;
  bytes[1] = offset_;
  return state.getIntrusivePtr();
}

std::pair<uint64_t, uint64_t> NeuronGenerator::reserve(uint64_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto first = offset_;
  offset_ += count;
  return {seed_, first};
}

NeuronGenerator* NeuronGenerator::clone_impl() const {
  auto* g = new NeuronGenerator(device().index());
  g->seed_ = seed_;
  g->offset_ = offset_;
  return g;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::vector<at::Generator> generators;
  static std::once_flag once;
  std::call_once(once, [] {
    for (c10::DeviceIndex i = 0; i < runtime()->device_count; ++i) {
      generators.push_back(at::make_generator<NeuronGenerator>(i));
    }
  });
  if (device < 0) device = current_device();
  check_device(device);
  return generators[device];
}


}  // namespace torch_neuron
