// Device guard, streams and events. A stream is a HAL queue of its device; an event records the
// device time at which its stream's submitted work completes (simulated time on the sim driver).
#include "Runtime.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace torch_neuron {
namespace {

thread_local c10::DeviceIndex tls_device = 0;
constexpr int kMaxDevices = 64;
thread_local c10::StreamId tls_stream[kMaxDevices] = {};
std::atomic<c10::StreamId> next_stream{1};

struct Event {
  double ns = -1.0;  // device time when the recorded work completes; < 0 before record
  c10::DeviceIndex device = -1;
  c10::StreamId stream = 0;
};

c10::Device neuron(c10::DeviceIndex index) {
  return {c10::DeviceType::PrivateUse1, index};
}

// A device without an index (torch.Stream(device="neuron")) means the current one, as for CUDA; the index
// also selects this thread's stream slot, so it is checked against the table.
c10::Device resolve(c10::Device d) {
  c10::Device r = d.has_index() ? d : neuron(tls_device);
  TORCH_CHECK(r.index() >= 0 && r.index() < kMaxDevices, "neuron device index ", static_cast<int>(r.index()),
              " is outside 0..", kMaxDevices - 1);
  return r;
}

struct NeuronGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }

  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return neuron(tls_device); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.is_privateuseone(), "expected a neuron device, got ", d);
    set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) tls_device = d.index();
  }

  c10::Stream getStream(c10::Device d) const override {
    d = resolve(d);
    return c10::Stream(c10::Stream::UNSAFE, d, tls_stream[d.index()]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, resolve(d), 0);
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return c10::Stream(c10::Stream::UNSAFE, resolve(d), next_stream++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return getNewStream(d, 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto old = getStream(s.device());
    tls_stream[old.device_index()] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    Runtime* rt = runtime();
    return rt == nullptr ? 0 : rt->device_count;
  }
  // torch.accelerator.get_device_capability: tensors of every dtype live on the device and convert (DMA moves
  // any bytes; what no engine computes, e.g. float64, takes the counted CPU path), except the quantized ones.
  c10::DeviceCapability getDeviceCapability(c10::Device /*device*/) const override {
    c10::DeviceCapability cap;
    for (auto index : {c10::kIndex_QInt8, c10::kIndex_QUInt8, c10::kIndex_QInt32, c10::kIndex_QUInt4x2,
                       c10::kIndex_QUInt2x4}) {
      cap.capability_data.capability_bits &= ~(1ULL << index);
    }
    return cap;
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    if (*event == nullptr) *event = new Event();
    auto* e = static_cast<Event*>(*event);
    py::gil_scoped_acquire gil;
    e->ns = runtime()->timeline(stream.device_index(), stream.id()).cast<double>();
    e->device = stream.device_index();
    e->stream = stream.id();
  }
  void block(void* event, const c10::Stream& stream) const override {
    // The HAL runs work in submission order per device; a later submission on another queue
    // already starts after this event's work has been issued. Nothing to wait for on the host.
    (void)event;
    (void)stream;
  }
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& stream) const override {
    py::gil_scoped_acquire gil;
    runtime()->synchronize(stream.device_index(), stream.id());
  }
  void synchronizeEvent(void* /*event*/) const override {}
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    py::gil_scoped_acquire gil;
    runtime()->synchronize(device_index, -1);
  }
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->ns >= 0 && b->ns >= 0,
                "elapsed_time: both events must be recorded first");
    return (b->ns - a->ns) / 1e6;  // milliseconds of device time
  }
};

}  // namespace

Runtime* the_runtime = nullptr;
Runtime* runtime() { return the_runtime; }
void set_runtime(Runtime* r) { the_runtime = r; }

c10::DeviceIndex current_device() { return tls_device; }

void check_device(c10::DeviceIndex index) {
  c10::DeviceIndex count = runtime() == nullptr ? 0 : runtime()->device_count;
  // a RuntimeError, as CUDA's "invalid device ordinal"; the wording is device.py's _index
  TORCH_CHECK(index >= 0 && index < count, "The device index is out of range: neuron:", static_cast<int>(index),
              " does not exist, this machine has ", static_cast<int>(count), " neuron devices (valid indices 0..",
              static_cast<int>(count) - 1, ")");
}

void set_current_device(c10::DeviceIndex index) {
  check_device(index);
  tls_device = index;
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace torch_neuron
