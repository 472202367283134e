// The c10d backend of the `neuron` device: every collective stages its neuron tensors on the host (a
// host alias of device memory where the driver maps it, else a copy), runs on an inner gloo backend
// (built by Python over the same store), and copies results back when the staging was a copy. Python
// supplies two callables: `stage(tensors, read) -> [(host, copied)]` and `record(device, op, nbytes)`,
// which adds the collective's modelled NeuronLink time to the device's queue. Why this design:
// torch_neuron/distributed/__init__.py.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>

#include <mutex>
#include <thread>

namespace torch_neuron_dist {

using c10d::Backend;
using c10d::OpType;
using c10d::ReduceOp;
using c10d::Work;
using Tensors = std::vector<at::Tensor>;
using WorkPtr = c10::intrusive_ptr<Work>;

// Neuron tensors and their host stand-ins; `finish` copies back the outputs that were staged by copy.
struct Staging {
  Tensors device, host;
  std::vector<bool> copied;

  void finish() {
    for (size_t i = 0; i < device.size(); ++i) {
      if (copied[i]) device[i].copy_(host[i]);
    }
  }
};

// What a NeuronWork and the future chained on its gloo works share: `finish` runs once, in whichever
// thread gets there first (the waiter, or gloo's thread completing the future DDP's reducer chains on).
struct Finisher {
  std::function<void()> finish;
  Tensors outputs;
  std::mutex mutex;
  bool finished = false;

  void once() {
    std::lock_guard<std::mutex> hold(mutex);
    if (!finished) {
      finish();
      finished = true;
    }
  }
};

// Completes when every inner gloo work has and the results are back in the neuron tensors.
class NeuronWork : public Work {
 public:
  NeuronWork(int rank, OpType type, std::vector<WorkPtr> inner, std::function<void()> finish, Tensors outputs)
      : Work(rank, type), inner_(std::move(inner)), state_(std::make_shared<Finisher>()) {
    state_->finish = std::move(finish);
    state_->outputs = std::move(outputs);
    c10::List<c10::intrusive_ptr<c10::ivalue::Future>> futures(c10::FutureType::create(c10::AnyType::get()));
    try {
      for (auto& w : inner_) futures.push_back(w->getFuture());
    } catch (const c10::Error&) {
      return;  // gloo's send / recv / reduce_scatter works have no future: getFuture() makes one
    }
    auto state = state_;
    future_ = c10::collectAll(futures)->then(
        [state, futures](c10::ivalue::Future&) -> c10::IValue {
          for (size_t i = 0; i < futures.size(); ++i) {
            c10::intrusive_ptr<c10::ivalue::Future> f = futures.get(i);
            if (f->hasError()) std::rethrow_exception(f->exception_ptr());
          }
          state->once();
          return c10::IValue(state->outputs);
        },
        c10::ListType::create(c10::TensorType::get()));
  }

  // Gloo's send/recv wait() is not idempotent (a second waiter waits for a second message): once a thread
  // waits for the future, callers of wait() wait for that future instead of the gloo work.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> hold(futureMutex_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
      threaded_ = true;
      std::thread(waiter, inner_, state_, future_).detach();
    }
    return future_;
  }

  static void waiter(std::vector<WorkPtr> inner, std::shared_ptr<Finisher> state,
                     c10::intrusive_ptr<c10::ivalue::Future> future) {
    try {
      for (auto& w : inner) w->wait();
      state->once();
      future->markCompleted(c10::IValue(state->outputs));
    } catch (...) {
      future->setError(std::current_exception());
    }
  }

  bool isCompleted() override {
    for (auto& w : inner_) {
      if (!w->isCompleted()) return false;
    }
    return true;
  }

  bool isSuccess() const override {
    for (auto& w : inner_) {
      if (!w->isSuccess()) return false;
    }
    return true;
  }

  std::exception_ptr exception() const override {
    for (auto& w : inner_) {
      if (auto e = w->exception()) return e;
    }
    return nullptr;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    bool threaded;
    {
      std::lock_guard<std::mutex> hold(futureMutex_);
      threaded = threaded_;
    }
    if (threaded) return waitFuture(timeout);
    for (auto& w : inner_) w->wait(timeout);  // raises gloo's error: a peer gone, or the timeout
    state_->once();
    return true;
  }

  std::vector<at::Tensor> result() override { return state_->outputs; }

 private:
  std::vector<WorkPtr> inner_;
  std::shared_ptr<Finisher> state_;
  std::mutex futureMutex_;
  bool threaded_ = false;
  c10::intrusive_ptr<c10::ivalue::Future> future_;

  bool waitFuture(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!future_->completed()) {
      TORCH_CHECK(timeout.count() == 0 || std::chrono::steady_clock::now() < deadline,
                  "neuron collective timed out after ", timeout.count(), " ms");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
};

size_t nbytes(const Tensors& ts) {
  size_t n = 0;
  for (auto& t : ts) n += t.numel() * t.element_size();
  return n;
}

Tensors flat(const std::vector<Tensors>& lists) {
  Tensors out;
  for (auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

std::vector<Tensors> unflat(const Tensors& ts, const std::vector<Tensors>& shape) {
  std::vector<Tensors> out;
  size_t i = 0;
  for (auto& l : shape) {
    out.emplace_back(ts.begin() + i, ts.begin() + i + l.size());
    i += l.size();
  }
  return out;
}

class ProcessGroupNeuron : public Backend {
 public:
  ProcessGroupNeuron(c10::intrusive_ptr<Backend> gloo, int rank, int size, py::object stage, py::object record)
      : Backend(rank, size), gloo_(std::move(gloo)), stage_(std::move(stage)), record_(std::move(record)) {}

  ~ProcessGroupNeuron() override {
    py::gil_scoped_acquire gil;  // the callables are Python objects
    stage_ = py::object();
    record_ = py::object();
  }

  const std::string getBackendName() const override { return "neuron"; }
  bool supportsCoalescing() const override { return true; }
  void setTimeout(std::chrono::milliseconds timeout) override { gloo_->setTimeout(timeout); }
  void setSequenceNumberForGroup() override { gloo_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return gloo_->getSequenceNumberForGroup(); }
  void abort() override { gloo_->abort(); }
  void shutdown() override { gloo_->shutdown(); }

  void startCoalescing() override {
    coalescing_ = true;
    coalesced_.clear();
  }

  WorkPtr endCoalescing() override {
    coalescing_ = false;
    auto works = std::move(coalesced_);
    coalesced_.clear();
    return c10::make_intrusive<NeuronWork>(getRank(), OpType::COALESCED, works, [] {}, Tensors());
  }

  WorkPtr broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override {
    auto s = stage(tensors, true);
    charge("broadcast", tensors);
    return done(OpType::BROADCAST, {gloo_->broadcast(s.host, opts)}, s, tensors);
  }

  WorkPtr allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override {
    auto s = stage(tensors, true);
    auto o = opts;
    o.reduceOp = premultiplied(s.host, opts.reduceOp, true);
    charge("allreduce", tensors);
    return done(OpType::ALLREDUCE, {gloo_->allreduce(s.host, o)}, s, tensors);
  }

  WorkPtr allreduce_coalesced(Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    auto s = stage(tensors, true);
    auto o = opts;
    o.reduceOp = premultiplied(s.host, opts.reduceOp, true);
    charge("allreduce", tensors);
    return done(OpType::ALLREDUCE_COALESCED, {gloo_->allreduce_coalesced(s.host, o)}, s, tensors);
  }

  WorkPtr reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override {
    auto s = stage(tensors, true);
    auto o = opts;
    o.reduceOp = premultiplied(s.host, opts.reduceOp, true);
    if (getRank() != opts.rootRank) s.copied.assign(s.copied.size(), false);  // only the root's changes
    charge("reduce", tensors);
    return done(OpType::REDUCE, {gloo_->reduce(s.host, o)}, s, tensors);
  }

  WorkPtr allgather(std::vector<Tensors>& outputs, Tensors& inputs, const c10d::AllgatherOptions& opts) override {
    auto in = stage(inputs, true);
    auto out = stage(flat(outputs), false);
    auto host = unflat(out.host, outputs);
    charge("allgather", flat(outputs));
    return done(OpType::ALLGATHER, {gloo_->allgather(host, in.host, opts)}, out, flat(outputs));
  }

  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) override {
    auto in = stage({input}, true);
    auto out = stage({output}, false);
    charge("allgather", {output});
    return done(OpType::_ALLGATHER_BASE, {gloo_->_allgather_base(out.host[0], in.host[0], opts)}, out, {output});
  }

  WorkPtr allgather_coalesced(std::vector<Tensors>& outputs, Tensors& inputs,
                              const c10d::AllgatherOptions& opts) override {
    auto in = stage(inputs, true);
    auto out = stage(flat(outputs), false);
    auto host = unflat(out.host, outputs);
    charge("allgather", flat(outputs));
    return done(OpType::ALLGATHER_COALESCED, {gloo_->allgather_coalesced(host, in.host, opts)}, out, flat(outputs));
  }

  WorkPtr allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                          const c10d::AllgatherOptions& opts) override {
    auto in = stage(inputs, true);
    auto out = stage(outputs, false);
    std::vector<WorkPtr> works;
    for (size_t i = 0; i < inputs.size(); ++i) works.push_back(gloo_->_allgather_base(out.host[i], in.host[i], opts));
    charge("allgather", outputs);
    return done(OpType::COALESCED, works, out, outputs);
  }

  WorkPtr gather(std::vector<Tensors>& outputs, Tensors& inputs, const c10d::GatherOptions& opts) override {
    auto in = stage(inputs, true);
    auto out = stage(flat(outputs), false);
    auto host = unflat(out.host, outputs);
    charge("gather", inputs);
    return done(OpType::GATHER, {gloo_->gather(host, in.host, opts)}, out, flat(outputs));
  }

  WorkPtr scatter(Tensors& outputs, std::vector<Tensors>& inputs, const c10d::ScatterOptions& opts) override {
    auto in = stage(flat(inputs), true);
    auto host = unflat(in.host, inputs);
    auto out = stage(outputs, false);
    charge("scatter", outputs);
    return done(OpType::SCATTER, {gloo_->scatter(out.host, host, opts)}, out, outputs);
  }

  WorkPtr reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                         const c10d::ReduceScatterOptions& opts) override {
    auto in = stage(flat(inputs), true);
    auto o = opts;
    o.reduceOp = premultiplied(in.host, opts.reduceOp, false);
    auto host = unflat(in.host, inputs);
    auto out = stage(outputs, false);
    charge("reduce_scatter", flat(inputs));
    return done(OpType::REDUCE_SCATTER, {gloo_->reduce_scatter(out.host, host, o)}, out, outputs);
  }

  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                               const c10d::ReduceScatterOptions& opts) override {
    auto in = stage({input}, true);
    auto o = opts;
    o.reduceOp = premultiplied(in.host, opts.reduceOp, false);
    auto out = stage({output}, false);
    charge("reduce_scatter", {input});
    return done(OpType::_REDUCE_SCATTER_BASE, {gloo_->_reduce_scatter_base(out.host[0], in.host[0], o)}, out,
                {output});
  }

  WorkPtr reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                          const c10d::ReduceScatterOptions& opts) override {
    auto in = stage(inputs, true);
    auto o = opts;
    o.reduceOp = premultiplied(in.host, opts.reduceOp, false);
    auto out = stage(outputs, false);
    std::vector<WorkPtr> works;
    for (size_t i = 0; i < inputs.size(); ++i) {
      works.push_back(gloo_->_reduce_scatter_base(out.host[i], in.host[i], o));
    }
    charge("reduce_scatter", inputs);
    return done(OpType::COALESCED, works, out, outputs);
  }

  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
                        std::vector<int64_t>& inputSplits, const c10d::AllToAllOptions& opts) override {
    auto in = stage({input}, true);
    auto out = stage({output}, false);
    charge("alltoall", {input});
    return done(OpType::ALLTOALL_BASE, {gloo_->alltoall_base(out.host[0], in.host[0], outputSplits, inputSplits, opts)},
                out, {output});
  }

  // Gloo's list alltoall wants equal sizes; c10d allows any: one alltoall_base over the concatenations.
  WorkPtr alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts) override {
    auto in = stage(inputs, true);
    auto out = stage(outputs, false);
    Tensors flats;
    std::vector<int64_t> inSplits, outSplits;
    for (auto& h : in.host) {
      flats.push_back(h.reshape(-1));
      inSplits.push_back(h.numel());
    }
    int64_t received = 0;
    for (auto& h : out.host) {
      outSplits.push_back(h.numel());
      received += h.numel();
    }
    auto send = at::cat(flats);
    auto recv = at::empty({received}, send.options());
    charge("alltoall", inputs);
    auto work = gloo_->alltoall_base(recv, send, outSplits, inSplits, opts);
    auto finish = [out, recv]() mutable {  // not the split vectors: gloo may have moved them
      int64_t at = 0;
      for (auto& h : out.host) {
        h.copy_(recv.narrow(0, at, h.numel()).view(h.sizes()));
        at += h.numel();
      }
      out.finish();
    };
    auto result = c10::make_intrusive<NeuronWork>(getRank(), OpType::ALLTOALL, std::vector<WorkPtr>{work}, finish,
                                                  outputs);
    if (coalescing_) coalesced_.push_back(result);
    return result;
  }

  WorkPtr send(Tensors& tensors, int dstRank, int tag) override {
    auto s = stage(tensors, true);
    s.copied.assign(s.copied.size(), false);
    charge("send", tensors);
    return done(OpType::SEND, {gloo_->send(s.host, dstRank, tag)}, s, tensors);
  }

  WorkPtr recv(Tensors& tensors, int srcRank, int tag) override {
    auto s = stage(tensors, false);
    charge("recv", tensors);
    return done(OpType::RECV, {gloo_->recv(s.host, srcRank, tag)}, s, tensors);
  }

  WorkPtr recvAnysource(Tensors& tensors, int tag) override {
    auto s = stage(tensors, false);
    charge("recv", tensors);
    return done(OpType::RECVANYSOURCE, {gloo_->recvAnysource(s.host, tag)}, s, tensors);
  }

  WorkPtr barrier(const c10d::BarrierOptions& opts) override {
    // c10d reaches this backend for barriers on the neuron device only; -2: the current neuron device
    int device = opts.device_ids.empty() ? -2 : static_cast<int>(opts.device_ids[0]);
    if (opts.device && opts.device->type() == c10::DeviceType::PrivateUse1) device = opts.device->index();
    chargeOn(device, "barrier", 0);
    auto o = opts;
    o.device = std::nullopt;  // gloo's barrier is host-side; it has no neuron device to bind
    return done(OpType::BARRIER, {gloo_->barrier(o)}, Staging(), {});
  }

 private:
  // Host stand-ins for `tensors`; `read`: the collective reads their values (else they are outputs only).
  Staging stage(const Tensors& tensors, bool read) {
    Staging s;
    s.device = tensors;
    py::gil_scoped_acquire gil;
    auto staged = stage_(tensors, read).cast<std::vector<std::pair<at::Tensor, bool>>>();
    for (auto& [host, copied] : staged) {
      s.host.push_back(host);
      s.copied.push_back(copied);
    }
    return s;
  }

  // PREMUL_SUM (FSDP2's gradient reduction) is a SUM of inputs scaled first: gloo has no such op. In
  // place when the inputs are the outputs (allreduce), else on fresh host copies (the caller's inputs
  // must keep their values).
  ReduceOp premultiplied(Tensors& host, const ReduceOp& op, bool in_place) {
    if (op.op_ != ReduceOp::PREMUL_SUM) return op;
    auto supplement = c10::static_intrusive_pointer_cast<c10d::PreMulSumSupplement>(op.supplement_);
    for (auto& h : host) {
      // the factor in the tensor's dtype, as NCCL applies it
      auto factor = supplement->tensor_factor.defined() ? supplement->tensor_factor.to(at::kCPU, h.scalar_type())
                                                        : at::scalar_tensor(supplement->double_factor, h.options());
      if (in_place) {
        h.mul_(factor);
      } else {
        h = h.mul(factor);
      }
    }
    return ReduceOp(ReduceOp::SUM);
  }

  void charge(const char* op, const Tensors& tensors) {
    int device = -1;
    for (auto& t : tensors) {
      if (t.device().type() == c10::DeviceType::PrivateUse1) device = t.device().index();
    }
    chargeOn(device, op, nbytes(tensors));
  }

  void chargeOn(int device, const char* op, size_t bytes) {
    py::gil_scoped_acquire gil;
    record_(device, op, bytes);
  }

  WorkPtr done(OpType type, std::vector<WorkPtr> inner, Staging s, Tensors outputs) {
    auto work = c10::make_intrusive<NeuronWork>(getRank(), type, std::move(inner), [s]() mutable { s.finish(); },
                                                std::move(outputs));
    if (coalescing_) coalesced_.push_back(work);
    return work;
  }

  c10::intrusive_ptr<Backend> gloo_;
  py::object stage_, record_;
  bool coalescing_ = false;
  std::vector<WorkPtr> coalesced_;
};

}  // namespace torch_neuron_dist

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using torch_neuron_dist::ProcessGroupNeuron;
  py::class_<ProcessGroupNeuron, c10d::Backend, c10::intrusive_ptr<ProcessGroupNeuron>>(m, "ProcessGroupNeuron")
      .def(py::init<c10::intrusive_ptr<c10d::Backend>, int, int, py::object, py::object>(), py::arg("gloo"),
           py::arg("rank"), py::arg("size"), py::arg("stage"), py::arg("record"));
}
