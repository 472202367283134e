// torch.profiler's neuron device events: see Kineto.cpp.
#pragma once

#include <string>

namespace torch_neuron {

// One program execution (device times in ns on the device's own timeline) for the recording kineto session, if
// any; attributed to the innermost profiled op running on the calling thread. Returns whether one is recording.
bool kineto_record(int device, int queue, double start_ns, double end_ns, const std::string& op,
                   const std::string& program);

}  // namespace torch_neuron
