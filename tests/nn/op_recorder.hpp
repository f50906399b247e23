#pragma once
// The ATen operators that run while an OpRecorder lives (through libtorch's RecordFunction
// callbacks: this thread's, and autograd's backward threads, to which libtorch carries them):
// each operator's name, its nesting depth (1: called by medfast's code, deeper: inside
// another operator), whether it copied without changing the dtype (aten::copy_ of a source
// of the destination's dtype), and the layout of each 5-D floating output. Used by the
// channels-last tests (the layout at every operator) and the GPU step test (no hidden layout
// round trip under forward and backward).
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <mutex>
#include <string>
#include <vector>

namespace medfast::test {

class OpRecorder {
 public:
  struct Op {
    std::string name;
    int depth = 0;
    bool same_dtype_copy = false;  // aten::copy_ from a tensor of the destination's dtype
    /// Per 5-D floating input and output with more than one channel: channels-last
    /// (suggest_memory_format), contiguous (NCDHW), either (dense in both: a 1x1x1 volume) or
    /// strided (neither).
    std::vector<std::string> input_layouts, layouts;
  };

  OpRecorder() {
    state().ops.clear();
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&start, &end).needsInputs(true).needsOutputs(true).scopes({at::RecordScope::FUNCTION}));
  }
  ~OpRecorder() { at::removeCallback(handle_); }
  OpRecorder(const OpRecorder&) = delete;
  OpRecorder& operator=(const OpRecorder&) = delete;

  std::vector<Op> ops() const {
    std::lock_guard<std::mutex> lock(state().mutex);
    return state().ops;
  }

 private:
  struct State {
    std::mutex mutex;
    std::vector<Op> ops;
  };
  static State& state() {
    static State s;
    return s;
  }
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
  static std::string layout_of(const at::Tensor& t) {
    // Dense in both orders (a 1x1x1 volume): the same memory either way.
    if (t.is_contiguous() && t.is_contiguous(at::MemoryFormat::ChannelsLast3d)) return "either";
    if (t.suggest_memory_format() == at::MemoryFormat::ChannelsLast3d) return "channels_last";
    return t.is_contiguous() ? "contiguous" : "strided";
  }
  static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction&) {
    ++depth();
    return nullptr;
  }
  static void end(const at::RecordFunction& fn, at::ObserverContext*) {
    Op op;
    op.name = fn.name();
    op.depth = depth()--;
    const auto inputs = fn.inputs();
    if (op.name == "aten::copy_") {
      op.same_dtype_copy = inputs.size() >= 2 && inputs[0].isTensor() && inputs[1].isTensor() &&
                           inputs[0].toTensor().scalar_type() == inputs[1].toTensor().scalar_type();
    }
    auto note = [](const c10::IValue& v, std::vector<std::string>& into) {
      if (!v.isTensor()) return;
      const at::Tensor& t = v.toTensor();
      if (t.defined() && t.dim() == 5 && t.is_floating_point() && t.size(1) > 1) into.push_back(layout_of(t));
    };
    for (const auto& v : inputs) note(v, op.input_layouts);
    for (const auto& v : fn.outputs()) note(v, op.layouts);
    std::lock_guard<std::mutex> lock(state().mutex);
    state().ops.push_back(std::move(op));
  }
  at::CallbackHandle handle_;
};

}  // namespace medfast::test
