// Pinned host memory for neuron transfers (Tensor.pin_memory(), DataLoader(pin_memory=True)): page-aligned
// blocks, page-locked with mlock where the process's RLIMIT_MEMLOCK allows (device DMA reads locked pages;
// on the simulator transfers are copies either way), and registered so is_pinned() answers for any address
// inside a block, as CUDA's does. A block the limit does not let lock is still aligned and registered (the
// transfer contract is the same); memory_locked_bytes() says how much really is locked.
#include "PinnedMemory.h"

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>

namespace torch_neuron {
namespace {

struct Block {
  size_t size;
  bool locked;
};

std::mutex mu;
std::map<uintptr_t, Block> blocks;  // start -> block
size_t locked_bytes = 0;

size_t page() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

void release(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = blocks.find(reinterpret_cast<uintptr_t>(ptr));
    if (it != blocks.end()) {
      if (it->second.locked) {
        munlock(ptr, it->second.size);
        locked_bytes -= it->second.size;
      }
      blocks.erase(it);
    }
  }
  std::free(ptr);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    size_t size = (std::max<size_t>(nbytes, 1) + page() - 1) / page() * page();
    void* ptr = nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&ptr, page(), size) == 0,
                     "pin_memory: could not allocate ", nbytes, " bytes of host memory");
    bool locked = mlock(ptr, size) == 0;
    {
      std::lock_guard<std::mutex> g(mu);
      blocks[reinterpret_cast<uintptr_t>(ptr)] = {size, locked};
      if (locked) locked_bytes += size;
    }
    return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

PinnedAllocator allocator;

}  // namespace

c10::Allocator* pinned_allocator() { return &allocator; }

bool is_pinned(const void* data) {
  auto p = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> g(mu);
  auto it = blocks.upper_bound(p);
  if (it == blocks.begin()) return false;
  --it;
  return p < it->first + it->second.size;
}

size_t memory_locked_bytes() {
  std::lock_guard<std::mutex> g(mu);
  return locked_bytes;
}

}  // namespace torch_neuron
