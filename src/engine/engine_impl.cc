// The Engine behind engine.h: an EngineCore (the generation loop, engine_core.h) stepped by one
// engine thread, with the submission queue, the abort list and the stats snapshot (under mu_)
// shared with the HTTP threads, and one stream per request (each with its own lock).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/queue_stream.h"
#include "kernels/probe.h"
#include "kernels/work_counter.h"

namespace peng {

const std::map<std::string, DType>& KvCacheDtypes() {
  static const std::map<std::string, DType> names = {
      {"f16", DType::kF16}, {"f32", DType::kF32}, {"q8_0", DType::kQ8_0}};
  return names;
}

std::string KvCacheDtypeName(DType kv_dtype) {
  for (const auto& [name, t] : KvCacheDtypes())
    if (t == kv_dtype) return name;
  return DTypeName(kv_dtype);
}

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One step's times and kernel work, for the utilization window (EngineStats).
struct StepRecord {
  Clock::time_point end;
  double seconds = 0;
  kernels::WorkCounts work;
};

struct Submitted {
  GenerateRequest request;
  std::shared_ptr<QueueStream> stream;
  Clock::time_point arrival;
};

class EngineImpl : public Engine {
 public:
  EngineImpl(const EngineOptions& o, std::unique_ptr<EngineCore> core)
      : opt_(o), core_(std::move(core)) {
    core_->FillStats(&stats_);
    stats_.peak_read_bytes_per_s = o.peak_read_bytes_per_s;
    stats_.peak_flops_f32_per_s = o.peak_flops_f32_per_s;
    stats_.peak_ops_int8_per_s = o.peak_ops_int8_per_s;
    if (o.measure_peaks && (o.peak_read_bytes_per_s <= 0 || o.peak_flops_f32_per_s <= 0 ||
                            o.peak_ops_int8_per_s <= 0)) {
      const kernels::MachinePeaks m = kernels::MeasureMachinePeaks(&core_->executor().pool());
      if (o.peak_read_bytes_per_s <= 0) stats_.peak_read_bytes_per_s = m.read_bytes_per_s;
      if (o.peak_flops_f32_per_s <= 0) stats_.peak_flops_f32_per_s = m.flops_f32_per_s;
      if (o.peak_ops_int8_per_s <= 0) stats_.peak_ops_int8_per_s = m.ops_int8_per_s;
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~EngineImpl() override { Stop(); }

  StatusOr<std::shared_ptr<RequestStream>> Submit(GenerateRequest request) override;
  void Abort(const std::string& id) override {
    std::lock_guard<std::mutex> lk(mu_);
    aborts_.push_back(id);
    cv_.notify_all();
  }
  EngineStats GetStats() const override;
  const Tokenizer* tokenizer() const override { return core_->tokenizer(); }
  const ModelConfig& model_config() const override { return core_->model_config(); }
  int64_t max_model_len() const override { return core_->max_model_len(); }
  bool Drain(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lk(mu_);
    draining_ = true;
    return done_cv_.wait_for(lk, timeout, [&] { return stopped_ || (in_flight_.empty() && idle_); });
  }
  void Stop() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = draining_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop();
  void Admit(Submitted s);
  void Deliver(std::vector<EngineCoreOutput> outputs);
  // `step_begin`: the step that began then has just ended; its times and work are added.
  void PublishStats(const Clock::time_point* step_begin = nullptr);
  void RecordStepLocked(Clock::time_point begin, Clock::time_point end);

  const EngineOptions opt_;
  std::unique_ptr<EngineCore> core_;  // engine thread only (its const accessors: any thread)

  // Engine thread only.
  std::unordered_map<std::string, std::shared_ptr<QueueStream>> streams_;

  // Shared with the API threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the engine thread
  std::condition_variable done_cv_;  // a request finished (Drain)
  std::vector<Submitted> submitted_;
  std::vector<std::string> aborts_;
  std::unordered_set<std::string> in_flight_;
  bool draining_ = false, stop_ = false, stopped_ = false;
  bool idle_ = true;  // no request was active at the last stats publication
  EngineStats stats_;
  std::deque<StepRecord> recent_steps_;  // those that ended in the last utilization window
  std::thread thread_;
};

StatusOr<std::shared_ptr<RequestStream>> EngineImpl::Submit(GenerateRequest request) {
  PENG_RETURN_IF_ERROR(core_->Validate(request));
  Submitted s;
  s.stream = std::make_shared<QueueStream>(request.n);
  std::shared_ptr<RequestStream> stream = s.stream;
  std::lock_guard<std::mutex> lk(mu_);
  if (draining_) return ResourceExhausted("the engine is shutting down");
  if (!stats_.fatal_error.empty()) return Internal("the engine cannot run: " + stats_.fatal_error);
  if (in_flight_.count(request.id)) return InvalidArgument("duplicate request id " + request.id);
  if (stats_.num_waiting + static_cast<int64_t>(submitted_.size()) >= opt_.max_waiting)
    return ResourceExhausted("too many waiting requests");
  in_flight_.insert(request.id);
  idle_ = false;
  s.arrival = Clock::now();
  s.request = std::move(request);
  submitted_.push_back(std::move(s));
  cv_.notify_all();
  return stream;
}

void EngineImpl::Loop() {
  std::vector<Submitted> fresh;
  std::vector<std::string> aborts;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] {
        return stop_ || !submitted_.empty() || !aborts_.empty() || core_->HasUnfinished();
      });
      if (stop_) break;
      fresh.swap(submitted_);
      aborts.swap(aborts_);
    }
    const Clock::time_point begin = Clock::now();
    for (Submitted& s : fresh) Admit(std::move(s));
    fresh.clear();
    for (const std::string& id : aborts) core_->Abort(id);
    aborts.clear();
    const bool stepped = core_->HasUnfinished();
    Deliver(core_->Step());
    PublishStats(stepped ? &begin : nullptr);
  }
  for (Submitted& s : submitted_) Admit(std::move(s));  // aborted below
  submitted_.clear();
  core_->AbortAll();
  Deliver(core_->Step());
  PublishStats();
  std::lock_guard<std::mutex> lk(mu_);
  stopped_ = true;
  done_cv_.notify_all();
}

void EngineImpl::Admit(Submitted s) {
  const std::string id = s.request.id;
  streams_[id] = s.stream;
  if (Status st = core_->Add(std::move(s.request), s.arrival); !st.ok()) {
    // Validated in Submit(); only an engine bug lands here. The request ends, not the engine.
    std::vector<EngineCoreOutput> end(s.stream->num_completions());
    for (size_t i = 0; i < end.size(); ++i) {
      end[i].request_id = id;
      end[i].output.index = static_cast<int>(i);
      end[i].output.finish_reason = "error";
      end[i].output.error = st.message();
      end[i].request_finished = i + 1 == end.size();
    }
    Deliver(std::move(end));
  }
}

// Hands events to their streams. A request's id is free again (in_flight_) just before its
// last event is pushed, so a client that saw the end can reuse it at once.
void EngineImpl::Deliver(std::vector<EngineCoreOutput> outputs) {
  for (EngineCoreOutput& o : outputs) {
    auto it = streams_.find(o.request_id);
    if (it == streams_.end()) continue;
    std::shared_ptr<QueueStream> stream = it->second;
    if (o.request_finished) {
      streams_.erase(it);
      std::lock_guard<std::mutex> lk(mu_);
      in_flight_.erase(o.request_id);
    }
    stream->Push(std::move(o.output));
  }
}

// Publishes the stats; Drain() returns only after a publication that found the engine idle,
// so the stats it then reads are final.
void EngineImpl::PublishStats(const Clock::time_point* step_begin) {
  const Clock::time_point step_end = Clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  if (step_begin) RecordStepLocked(*step_begin, step_end);
  idle_ = !core_->HasUnfinished();
  if (idle_) done_cv_.notify_all();
  core_->FillStats(&stats_);
}

// Adds the step [begin, end) to the phase totals and the utilization window (under mu_).
void EngineImpl::RecordStepLocked(Clock::time_point begin, Clock::time_point end) {
  const StepInfo& step = core_->last_step();
  double phase[4] = {0, 0, 0, 0};
  if (step.forward_ran) {
    phase[kPhaseSchedule] = Seconds(step.forward_begin - begin);
    phase[kPhaseForward] = Seconds(step.forward_end - step.forward_begin);
    phase[kPhaseSample] = step.sample_seconds;
    phase[kPhaseEmit] = std::max(0.0, Seconds(end - step.forward_end) - step.sample_seconds);
  } else {
    phase[kPhaseSchedule] = Seconds(end - begin);
  }
  StepRecord rec;
  rec.end = end;
  rec.seconds = Seconds(end - begin);
  rec.work = step.work;
  for (int i = 0; i < 4; ++i) stats_.phase_seconds_total[i] += phase[i];
  stats_.weight_bytes_total += rec.work.weight_bytes;
  stats_.kv_bytes_total += rec.work.kv_bytes;
  stats_.flops_f32_total += rec.work.flops_f32;
  stats_.ops_int8_total += rec.work.ops_int8;
  const auto window = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(opt_.utilization_window_s));
  while (!recent_steps_.empty() && recent_steps_.front().end < end - window)
    recent_steps_.pop_front();
  recent_steps_.push_back(rec);
}

EngineStats EngineImpl::GetStats() const {
  std::lock_guard<std::mutex> lk(mu_);
  EngineStats s = stats_;
  const Clock::time_point now = Clock::now();
  const auto window = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(opt_.utilization_window_s));
  double busy = 0;
  kernels::WorkCounts work;
  for (const StepRecord& r : recent_steps_) {
    if (r.end < now - window) continue;
    busy += r.seconds;
    work += r.work;
  }
  s.busy_fraction = std::min(1.0, busy / opt_.utilization_window_s);
  if (busy > 0) {
    s.read_bytes_per_s = static_cast<double>(work.weight_bytes + work.kv_bytes) / busy;
    s.ops_per_s = static_cast<double>(work.flops_f32 + work.ops_int8) / busy;
    if (s.peak_read_bytes_per_s > 0) s.bandwidth_utilization = s.read_bytes_per_s / s.peak_read_bytes_per_s;
    double compute_seconds = 0;  // the time each kind of op would take at its peak
    if (s.peak_flops_f32_per_s > 0) compute_seconds += work.flops_f32 / s.peak_flops_f32_per_s;
    if (s.peak_ops_int8_per_s > 0) compute_seconds += work.ops_int8 / s.peak_ops_int8_per_s;
    s.compute_utilization = compute_seconds / busy;
  }
  return s;
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& o) {
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core, CreateEngineCore(o));
  return std::unique_ptr<Engine>(new EngineImpl(o, std::move(core)));
}

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& o,
                                                 std::unique_ptr<Model> model,
                                                 std::unique_ptr<Tokenizer> tok) {
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core,
                        CreateEngineCore(o, std::move(model), std::move(tok)));
  return std::unique_ptr<Engine>(new EngineImpl(o, std::move(core)));
}

}  // namespace peng
