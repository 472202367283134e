// The autograd profiler's PrivateUse1 device timing (torch.autograd.profiler.profile(use_device="neuron")):
// torch records an event when each op enters and exits and reports the elapsed time between them as the op's
// device time. An event here is what a neuron torch.Event records (Guard.cpp): the device time at which the
// current stream's submitted work completes (simulated on the sim driver), so an op's device time is the
// device time of the programs it queued.
#include "Runtime.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

namespace torch_neuron {
namespace {

struct DeviceMark {
  double ns;  // device time when the stream's work submitted so far completes
};

const c10::impl::DeviceGuardImplInterface* guard() {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
}

struct NeuronProfilerStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    Runtime* rt = runtime();
    TORCH_CHECK(rt != nullptr, "torch_neuron runtime is not initialized");
    c10::DeviceIndex index = current_device();
    if (device != nullptr) *device = index;
    c10::Stream stream = guard()->getStream(c10::Device(c10::DeviceType::PrivateUse1, index));
    {
      py::gil_scoped_acquire gil;
      *event = std::make_shared<DeviceMark>(DeviceMark{rt->timeline(index, stream.id()).cast<double>()});
    }
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
  }

  // Microseconds, as torch's CUDA stubs return.
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    TORCH_CHECK(start != nullptr && end != nullptr && *start && *end, "neuron profiler: event not recorded");
    auto* a = static_cast<const DeviceMark*>(start->get());
    auto* b = static_cast<const DeviceMark*>(end->get());
    return static_cast<float>((b->ns - a->ns) / 1e3);
  }

  // The device has no external annotation tool (NVTX's role for CUDA); ranges are torch.neuron.profiler's.
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    Runtime* rt = runtime();
    c10::DeviceIndex count = rt == nullptr ? 0 : rt->device_count;
    c10::DeviceIndex old = current_device();
    for (c10::DeviceIndex d = 0; d < count; ++d) {
      set_current_device(d);
      op(d);
    }
    if (count > 0) set_current_device(old);
  }

  void synchronize() const override {
    Runtime* rt = runtime();
    if (rt == nullptr) return;
    for (c10::DeviceIndex d = 0; d < rt->device_count; ++d) guard()->synchronizeDevice(d);
  }
};

// Registered at load time, as torch's CUDA stubs are: the profiler looks them up when a profile starts.
struct Register {
  Register() {
    static NeuronProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} registered;

}  // namespace
}  // namespace torch_neuron
