// Pinned host memory for neuron transfers (see PinnedMemory.cpp).
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>

namespace torch_neuron {

c10::Allocator* pinned_allocator();
bool is_pinned(const void* data);
size_t memory_locked_bytes();

}  // namespace torch_neuron
