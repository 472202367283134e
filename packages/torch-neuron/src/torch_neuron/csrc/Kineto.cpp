// torch.profiler's device events for neuron (ProfilerActivity.PrivateUse1). torch runs such a profile in its
// KINETO_PRIVATEUSE1 state, which hands the factory registered here (PrivateUse1ProfilerRegistry) to libkineto as
// a child profiler; kineto then configures, starts and stops a session of it alongside its CPU trace and takes
// its activities into the trace torch reads (key_averages, events, export_chrome_trace).
//
// The device runs in Python (the simulator), so while a session records, torch_neuron.kineto reports each
// program execution here (kineto_record) with its device start/end. Device time is its own timeline, so it is
// mapped onto the profiler's clock (Unix ns, kineto's) by one offset per device: the device's present when the
// session starts is the wall time it starts at. Durations and the order on the device are exact; the device being
// simulated, its work does not line up with the host's wall time otherwise. Each execution is a kernel
// (CONCURRENT_KERNEL, which torch files under PrivateUse1) linked to the innermost op that launched it by
// kineto's correlation ids, so torch charges its time to that op's device time.
// GenericTraceActivity formats its metadata with fmt, whose compiled part libtorch does not export: in this file
// it is header-only (defined before anything includes fmt).
#define FMT_HEADER_ONLY
#include "Kineto.h"

#include "Runtime.h"

#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <libkineto.h>

#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <vector>

namespace torch_neuron {
namespace {

using libkineto::ActivityType;

struct Run {
  int device, queue;
  double start_ns, end_ns;  // device timeline
  std::string op, program;
  uint64_t correlation;  // 0: launched outside any profiled op
};

// The profiled ops running on this thread, innermost last (kineto pushes and pops them on the op's thread).
thread_local std::vector<uint64_t> correlations;

int64_t wall_ns() {
  using namespace std::chrono;
  return duration_cast<nanoseconds>(system_clock::now().time_since_epoch()).count();
}

py::module_ python_side() { return py::module_::import("torch_neuron.kineto"); }

class Session;
std::mutex recording_mutex;
Session* recording = nullptr;  // kineto runs one trace at a time

class Session final : public libkineto::IActivityProfilerSession {
 public:
  ~Session() override {
    std::lock_guard<std::mutex> lock(recording_mutex);
    if (recording == this) recording = nullptr;
  }

  void start() override {
    correlations.clear();  // a stack left by ops that began before kineto forwarded correlation ids to us
    {
      py::gil_scoped_acquire gil;
      presents_ = python_side().attr("_start")().cast<std::vector<double>>();
    }
    start_wall_ = wall_ns();
    std::lock_guard<std::mutex> lock(recording_mutex);
    recording = this;
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    {
      std::lock_guard<std::mutex> lock(recording_mutex);
      if (recording == this) recording = nullptr;
    }
    py::gil_scoped_acquire gil;
    python_side().attr("_stop")();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  void add(Run run) { runs_.push_back(std::move(run)); }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t start, int64_t end) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start, end, "neuron");
    buffer_->gpuOpCount = static_cast<int>(runs_.size());
    for (const Run& run : runs_) {
      std::string name = run.program == run.op ? run.op : run.program + " (" + run.op + ")";
      buffer_->emplace_activity(buffer_->span, ActivityType::CONCURRENT_KERNEL, name);
      auto& a = *buffer_->activities.back();
      a.device = run.device;
      a.resource = run.queue;
      a.threadId = run.queue;
      a.startTime = wall(run.device, run.start_ns);
      a.endTime = wall(run.device, run.end_ns);
      a.id = static_cast<int32_t>(run.correlation);
      a.linked = run.correlation != 0 && linked ? linked(static_cast<int32_t>(run.correlation)) : nullptr;
      a.addMetadataQuoted("op", run.op);
      a.addMetadataQuoted("program", run.program);
      a.addMetadata("queue", run.queue);
      a.addMetadata("device start ns", run.start_ns);
      a.addMetadata("device end ns", run.end_ns);
      a.log(logger);  // the logger keeps a pointer: the activity lives on in the buffer kineto takes next
      queues_[run.device].insert(run.queue);
    }
  }

  // The first device's name (kineto takes one per session); every device's queues are named as resources.
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    if (queues_.empty()) return nullptr;
    int64_t d = queues_.begin()->first;
    return std::unique_ptr<libkineto::DeviceInfo>(
        new libkineto::DeviceInfo{d, d + kSortAfterHost, "NeuronCore " + std::to_string(d), "neuron"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [device, queues] : queues_)
      for (int q : queues) out.push_back(libkineto::ResourceInfo{q, q, device, "queue " + std::to_string(q)});
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override { correlations.push_back(id); }
  void popCorrelationId() override {
    if (!correlations.empty()) correlations.pop_back();
  }

 private:
  static constexpr int64_t kSortAfterHost = 1 << 20;  // device tracks below the process's threads

  int64_t wall(int device, double device_ns) const {
    double present = device < static_cast<int>(presents_.size()) ? presents_[device] : 0.0;
    return start_wall_ + std::llround(device_ns - present);
  }

  std::vector<double> presents_;  // per device: its timeline when the session started
  int64_t start_wall_ = 0;
  std::vector<Run> runs_;
  std::map<int64_t, std::set<int>> queues_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    static const std::string name = "__neuron_profiler__";
    return name;
  }

  const std::set<ActivityType>& availableActivities() const override {
    static const std::set<ActivityType> kinds{ActivityType::CONCURRENT_KERNEL};
    return kinds;
  }

  // A session only for a profile that asks for device kernels (ProfilerActivity.PrivateUse1): a CPU-only profile
  // gets none, so nothing is observed or recorded.
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& kinds,
                                                                 const libkineto::Config& /*config*/) override {
    if (kinds.count(ActivityType::CONCURRENT_KERNEL) == 0) return nullptr;
    return std::make_unique<Session>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
                                                                 const std::set<ActivityType>& kinds,
                                                                 const libkineto::Config& config) override {
    return configure(kinds, config);
  }
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

}  // namespace

bool kineto_record(int device, int queue, double start_ns, double end_ns, const std::string& op,
                   const std::string& program) {
  uint64_t correlation = correlations.empty() ? 0 : correlations.back();
  std::lock_guard<std::mutex> lock(recording_mutex);
  if (recording == nullptr) return false;
  recording->add(Run{device, queue, start_ns, end_ns, op, program, correlation});
  return true;
}

}  // namespace torch_neuron
