// Tensor storage is simulated (or real) HBM: a DataPtr holds the HAL device address itself, so
// tensor.data_ptr() is the address kernels run on. Caching and statistics are in Python; the allocator is a
// c10::DeviceAllocator so device-generic code (torch.accelerator.memory_stats, empty_cache, ...) reaches them.
#include "Runtime.h"

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>

namespace torch_neuron {
namespace {

struct Block {
  uintptr_t address;
  c10::DeviceIndex device;
};

void release(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  Runtime* rt = runtime();
  if (rt != nullptr && Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    py::error_scope pending;  // tensors die while a Python error propagates: keep it aside
    try {
      rt->free(block->device, block->address);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("torch_neuron: freeing device memory");
    }
  }
  delete block;
}

py::object ask(const char* request, c10::DeviceIndex device) {
  Runtime* rt = runtime();
  TORCH_CHECK(rt != nullptr, "torch_neuron runtime is not initialized");
  return rt->memory(request, static_cast<int>(device));
}

// One statistic of torch.cuda.memory_stats()' dict ("allocated_bytes.all.current", ...) into a c10 Stat.
void fill(c10::CachingAllocator::Stat& stat, const py::dict& stats, const std::string& name) {
  auto get = [&](const char* part) -> int64_t {
    py::str key(name + ".all." + part);
    return stats.contains(key) ? stats[key].cast<int64_t>() : 0;
  };
  stat.current = get("current");
  stat.peak = get("peak");
  stat.allocated = get("allocated");
  stat.freed = get("freed");
}

int64_t count(const py::dict& stats, const char* name) {
  return stats.contains(name) ? stats[name].cast<int64_t>() : 0;
}

struct NeuronAllocator final : c10::DeviceAllocator {
  bool initialized() override { return runtime() != nullptr; }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    py::gil_scoped_acquire gil;
    ask("empty_cache", current_device());
  }

  // Work on every queue of a device runs in submission order (see Guard.cpp), so a block freed after work on
  // another stream is never reused before that work: nothing to track.
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    py::gil_scoped_acquire gil;
    py::dict stats = ask("stats", device);
    c10::CachingDeviceAllocator::DeviceStats out;
    using Arr = c10::CachingAllocator::StatArray;
    const std::pair<const char*, Arr*> arrays[] = {
        {"allocation", &out.allocation}, {"segment", &out.segment}, {"active", &out.active},
        {"inactive_split", &out.inactive_split}, {"allocated_bytes", &out.allocated_bytes},
        {"reserved_bytes", &out.reserved_bytes}, {"active_bytes", &out.active_bytes},
        {"inactive_split_bytes", &out.inactive_split_bytes}, {"requested_bytes", &out.requested_bytes}};
    for (const auto& [name, array] : arrays) {
      fill((*array)[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)], stats, name);
    }
    out.num_alloc_retries = count(stats, "num_alloc_retries");
    out.num_ooms = count(stats, "num_ooms");
    out.num_device_alloc = count(stats, "num_device_alloc");
    out.num_device_free = count(stats, "num_device_free");
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    py::gil_scoped_acquire gil;
    ask("reset_accumulated", device);
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    py::gil_scoped_acquire gil;
    ask("reset_peak", device);
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    py::gil_scoped_acquire gil;
    return ask("info", device).cast<std::pair<size_t, size_t>>();
  }

  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = current_device();
    c10::Device where(c10::DeviceType::PrivateUse1, device);
    if (nbytes == 0) {
      return {nullptr, nullptr, &c10::detail::deleteNothing, where};
    }
    Runtime* rt = runtime();
    TORCH_CHECK(rt != nullptr, "torch_neuron runtime is not initialized");
    uintptr_t address;
    {
      py::gil_scoped_acquire gil;
      try {
        address = rt->alloc(device, nbytes).cast<uintptr_t>();
      } catch (py::error_already_set& e) {
        // The Python allocator raises torch.OutOfMemoryError with requested/free/capacity.
        if (e.type().attr("__name__").cast<std::string>() == "OutOfMemoryError") {
          std::string message = py::str(e.value());
          TORCH_CHECK_WITH(OutOfMemoryError, false, message);
        }
        throw;
      }
    }
    auto* block = new Block{address, device};
    return {reinterpret_cast<void*>(address), block, &release, where};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr;  // blocks carry their device in the context; raw pointers cannot
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count == 0) return;
    py::gil_scoped_acquire gil;
    runtime()->copy(current_device(), reinterpret_cast<uintptr_t>(dest), reinterpret_cast<uintptr_t>(src), count);
  }
};

NeuronAllocator the_allocator;

}  // namespace

c10::Allocator* allocator() {
  return &the_allocator;
}

void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  size_t old = storage.nbytes();
  if (nbytes == old) return;
  c10::DeviceGuard guard(storage.device());
  c10::DataPtr fresh = the_allocator.allocate(nbytes);
  size_t keep = std::min(old, nbytes);
  if (keep > 0 && storage.data() != nullptr) {
    the_allocator.copy_data(fresh.get(), storage.data(), keep);
  }
  storage.set_data_ptr_noswap(std::move(fresh));
  storage.set_nbytes(nbytes);
}

}  // namespace torch_neuron

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, torch_neuron::allocator());
