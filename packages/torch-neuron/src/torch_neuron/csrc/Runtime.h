// The C++ side of torch-neuron is thin: device memory, devices, streams and events live in Python
// (torch_neuron.runtime, over neuron_hal). These are the calls C++ makes into it, with the GIL.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <torch/extension.h>

namespace torch_neuron {

struct Runtime {
  py::object alloc;          // (device, nbytes) -> address; raises torch.OutOfMemoryError
  py::object free;           // (device, address) -> None
  py::object copy;           // (device, dst, src, nbytes) -> None  device-to-device
  py::object device_of;      // (address) -> device index, or -1 when not device memory
  py::object timeline;       // (device, stream id) -> device time (ns) when the stream's work completes
  py::object synchronize;    // (device, stream id or -1) -> None
  py::object fallback;       // (operator name) -> None; raises in strict mode
  py::object memory;         // (request, device) -> the caching allocator's answer (see runtime.Runtime.memory)
  c10::DeviceIndex device_count = 0;
};

// Null until torch_neuron._C._init is called from Python; cleared at interpreter exit.
Runtime* runtime();
void set_runtime(Runtime* r);

c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
void check_device(c10::DeviceIndex index);

c10::Allocator* allocator();
// Grow (or shrink) a storage in place, keeping its bytes: used by tensor resize_ and storage resize_.
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes);

}  // namespace torch_neuron
