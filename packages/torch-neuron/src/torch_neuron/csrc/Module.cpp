// torch_neuron._C: the Python entry points of the C++ core.
#include "Generator.h"
#include "Kineto.h"
#include "PinnedMemory.h"
#include "Runtime.h"

#include <torch/csrc/Generator.h>

namespace torch_neuron {
namespace {

void init(py::object rt, int device_count) {
  auto* r = new Runtime();
  r->alloc = rt.attr("alloc");
  r->free = rt.attr("free");
  r->copy = rt.attr("copy");
  r->device_of = rt.attr("device_of");
  r->timeline = rt.attr("timeline");
  r->synchronize = rt.attr("synchronize");
  r->fallback = rt.attr("fallback");
  r->memory = rt.attr("memory");
  r->device_count = static_cast<c10::DeviceIndex>(device_count);
  set_runtime(r);
  // Storage freed during interpreter teardown must not call into a dying interpreter.
  py::module_::import("atexit").attr("register")(py::cpp_function([] { set_runtime(nullptr); }));
}

py::object default_generator_of(int device) {
  return py::reinterpret_steal<py::object>(
      THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(device))));
}

std::pair<uint64_t, uint64_t> reserve(const at::Generator& generator, uint64_t count) {
  auto* g = generator.get<NeuronGenerator>();
  TORCH_CHECK(g != nullptr && generator.device().is_privateuseone(),
              "expected a neuron generator, got one for ", generator.device());
  return g->reserve(count);
}

}  // namespace
}  // namespace torch_neuron

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("_init", &torch_neuron::init, "install the Python runtime callbacks");
  m.def("_is_initialized", [] { return torch_neuron::runtime() != nullptr; });
  m.def("_pinned_locked_bytes", &torch_neuron::memory_locked_bytes, "bytes of pinned host memory mlock holds");
  m.def("_current_device", [] { return static_cast<int>(torch_neuron::current_device()); });
  m.def("_set_device", [](int d) { torch_neuron::set_current_device(static_cast<c10::DeviceIndex>(d)); });
  m.def("_default_generator", &torch_neuron::default_generator_of);
  m.def("_kineto_record", &torch_neuron::kineto_record,
        "(device, queue, device start ns, device end ns, op, program) -> whether a torch.profiler session records");
  m.def("_rng_reserve", &torch_neuron::reserve, "(generator, count) -> (seed, offset); advances the offset");
}
