#include "server/metrics.h"

#include <charconv>
#include <cmath>

namespace peng::server {
namespace {

// Bucket bounds as vLLM uses them for the same metrics.
std::vector<double> TtftBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
std::vector<double> ItlBuckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4, 0.5,
          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> E2eBuckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

void Header(const std::string& name, const char* type, const char* help, std::string* out) {
  *out += "# HELP " + name + " " + help + "\n";
  *out += "# TYPE " + name + " " + type + "\n";
}

void Sample(const std::string& name, const std::string& labels, double v, std::string* out) {
  *out += name + "{" + labels + "} " + PromNumber(v) + "\n";
}

}  // namespace

std::string PromNumber(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string PromEscape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value, int64_t count) {
  size_t b = 0;
  while (b < bounds_.size() && value > bounds_[b]) ++b;
  counts_[b] += count;
  sum_ += value * static_cast<double>(count);
  count_ += count;
}

void Histogram::Render(const std::string& name, const std::string& labels,
                       std::string* out) const {
  const std::string sep = labels.empty() ? "" : ",";
  int64_t cum = 0;
  for (size_t b = 0; b <= bounds_.size(); ++b) {
    cum += counts_[b];
    const std::string le = b < bounds_.size() ? PromNumber(bounds_[b]) : "+Inf";
    *out += name + "_bucket{" + labels + sep + "le=\"" + le + "\"} " + std::to_string(cum) +
            "\n";
  }
  Sample(name + "_sum", labels, sum_, out);
  Sample(name + "_count", labels, static_cast<double>(count_), out);
}

ServerMetrics::ServerMetrics(std::string model_name)
    : model_label_("model_name=\"" + PromEscape(model_name) + "\""),
      ttft_(TtftBuckets()),
      itl_(ItlBuckets()),
      e2e_(E2eBuckets()),
      finished_{{"abort", 0}, {"length", 0}, {"stop", 0}} {}

void ServerMetrics::ObserveTimeToFirstToken(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(seconds);
}

void ServerMetrics::ObserveInterToken(double seconds, int64_t tokens) {
  if (tokens <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  itl_.Observe(seconds / static_cast<double>(tokens), tokens);
}

void ServerMetrics::ObserveE2eLatency(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  e2e_.Observe(seconds);
}

void ServerMetrics::RecordFinished(const std::string& finish_reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[finish_reason];
}

std::string ServerMetrics::Render(const EngineStats& s, int64_t http_connections) const {
  const std::string& l = model_label_;
  std::string out;
  auto gauge = [&](const char* name, const char* help, double v) {
    Header(std::string("peng_") + name, "gauge", help, &out);
    Sample(std::string("peng_") + name, l, v, &out);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    Header(std::string("peng_") + name, "counter", help, &out);
    Sample(std::string("peng_") + name, l, v, &out);
  };
  gauge("num_requests_running", "Number of requests in model execution batches.",
        static_cast<double>(s.num_running));
  gauge("num_requests_waiting", "Number of requests waiting to be processed.",
        static_cast<double>(s.num_waiting));
  gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage);
  Header("peng_cache_config_info", "gauge",
         "Information of the KV cache: tokens a block and the values' type (--block-size, "
         "--kv-cache-dtype).",
         &out);
  Sample("peng_cache_config_info",
         l + ",block_size=\"" + std::to_string(s.kv_block_size) + "\",cache_dtype=\"" +
             PromEscape(KvCacheDtypeName(s.kv_dtype)) + "\"",
         1, &out);
  gauge("tensor_parallel_size",
        "Processes the model is split over (1 = one process); every rank holds the same KV "
        "block ids, so the KV gauges are every rank's.",
        static_cast<double>(s.tensor_parallel_size));
  gauge("pipeline_parallel_size",
        "Stages the model's layers are split over, each tensor_parallel_size processes (1 = "
        "none); every stage holds the same KV block ids, for its layers.",
        static_cast<double>(s.pipeline_parallel_size));
  gauge("data_parallel_size",
        "Replicas of the model, each with its own scheduler and KV cache (1 = no data "
        "parallelism); the request and KV gauges above are their sums.",
        static_cast<double>(s.data_parallel_size));
  if (s.replicas.size() > 1) {  // each replica's load, labelled replica="d"
    const std::string sep = l.empty() ? "" : ",";
    auto per_replica = [&](const char* name, const char* type, const char* help, auto value) {
      Header(std::string("peng_") + name, type, help, &out);
      for (size_t d = 0; d < s.replicas.size(); ++d)
        Sample(std::string("peng_") + name, l + sep + "replica=\"" + std::to_string(d) + "\"",
               value(s.replicas[d]), &out);
    };
    using R = EngineStats::Replica;
    per_replica("replica_num_requests_running", "gauge",
                "Sequences running on the data-parallel replica.",
                [](const R& r) { return static_cast<double>(r.num_running); });
    per_replica("replica_num_requests_waiting", "gauge",
                "Sequences waiting for the data-parallel replica.",
                [](const R& r) { return static_cast<double>(r.num_waiting); });
    per_replica("replica_kv_cache_usage_perc", "gauge",
                "KV-cache usage of the data-parallel replica.",
                [](const R& r) { return r.kv_usage; });
    // Its rate is the share of wall time the replica's ranks spend in forward passes.
    per_replica("replica_forward_seconds_total", "counter",
                "Seconds the data-parallel replica spent in forward passes (on its leader rank).",
                [](const R& r) { return r.forward_seconds_total; });
  }
  gauge("kv_cache_used_blocks", "KV-cache blocks in use.",
        static_cast<double>(s.kv_blocks_used));
  gauge("kv_cache_capacity_blocks", "KV-cache blocks in the pool.",
        static_cast<double>(s.kv_blocks_total));
  gauge("kv_cache_fragmentation_perc",
        "Token slots of used KV blocks holding no token, as a share of the pool.",
        s.kv_fragmentation);
  gauge("kv_cache_fragmentation_mean_perc",
        "Mean of kv_cache_fragmentation_perc over engine steps with running requests.",
        s.kv_fragmentation_mean);
  gauge("kv_cache_fragmentation_max_perc",
        "Max of kv_cache_fragmentation_perc over engine steps with running requests.",
        s.kv_fragmentation_max);
  counter("request_failure_total",
          "Requests that failed inside the engine (finish_reason error); the engine went on.",
          static_cast<double>(s.requests_failed_total));
  gauge("engine_healthy",
        "1 while the engine can run steps; 0 for good once its device lost its context.",
        s.fatal_error.empty() ? 1 : 0);
  if (http_connections >= 0) {
    gauge("http_connections", "Open client connections.",
          static_cast<double>(http_connections));
  }
  counter("prefix_cache_queries_total", "Prefix cache queries, in number of queried tokens.",
          static_cast<double>(s.prefix_cache_queries));
  counter("prefix_cache_hits_total", "Prefix cache hits, in number of cached tokens.",
          static_cast<double>(s.prefix_cache_hits));
  counter("num_preemptions_total", "Cumulative number of preemptions from the engine.",
          static_cast<double>(s.num_preemptions_total));
  counter("prompt_tokens_total", "Number of prefill tokens processed.",
          static_cast<double>(s.prompt_tokens_total));
  counter("generation_tokens_total", "Number of generation tokens processed.",
          static_cast<double>(s.generation_tokens_total));
  counter("engine_steps_total", "Engine steps run.", static_cast<double>(s.steps_total));
  Header("peng_logit_rows_total", "counter",
         "Logit rows sampled, by what the model returned of them: its best logits alone (a "
         "device's, kind best), the wider list a nucleus past those takes (kind wide) or the "
         "whole row (kind whole).", &out);
  Sample("peng_logit_rows_total", l + ",kind=\"best\"",
         static_cast<double>(s.logit_rows_best_total), &out);
  Sample("peng_logit_rows_total", l + ",kind=\"wide\"",
         static_cast<double>(s.logit_rows_wide_total), &out);
  Sample("peng_logit_rows_total", l + ",kind=\"whole\"",
         static_cast<double>(s.logit_rows_whole_total), &out);
  // Utilization: what the kernels counted (kernels/work_counter.h) against the machine's
  // peaks (kernels/probe.h); rates over the steps of the last utilization window (2 s by default).
  counter("weight_read_bytes_total", "Bytes of weights the kernels read.",
          static_cast<double>(s.weight_bytes_total));
  counter("kv_cache_read_bytes_total", "Bytes of KV cache the attention kernels read.",
          static_cast<double>(s.kv_bytes_total));
  Header("peng_compute_ops_total", "counter",
         "Arithmetic the kernels did, 2 per multiply-add, by kind (FP32 FMAs or int8 dot "
         "products).", &out);
  Sample("peng_compute_ops_total", l + ",kind=\"fp32\"", static_cast<double>(s.flops_f32_total),
         &out);
  Sample("peng_compute_ops_total", l + ",kind=\"int8\"", static_cast<double>(s.ops_int8_total),
         &out);
  counter("engine_busy_seconds_total", "Seconds the engine spent in steps.",
          s.busy_seconds_total());
  Header("peng_step_phase_seconds_total", "counter",
         "Seconds of engine steps by phase: schedule (admit, schedule, batch; on a device the "
         "grammar masks too), forward (the model), sample (logits checks, bias, grammar, "
         "sampler), emit (detokenize, stop checks, stream events).", &out);
  for (int i = 0; i < 4; ++i) {
    Sample("peng_step_phase_seconds_total",
           l + ",phase=\"" + std::string(kStepPhaseNames[i]) + "\"", s.phase_seconds_total[i],
           &out);
  }
  Header("peng_request_queue_time_seconds", "summary",
         "Seconds requests waited from submission to their first engine step.", &out);
  Sample("peng_request_queue_time_seconds_sum", l, s.queue_wait_seconds_sum, &out);
  Sample("peng_request_queue_time_seconds_count", l, static_cast<double>(s.queue_wait_count),
         &out);
  gauge("engine_busy_perc", "Share of the last seconds the engine spent in steps (0-1).",
        s.busy_fraction);
  gauge("read_bandwidth_bytes_per_second",
        "Bytes (weights + KV cache) the kernels read per second of step time, last seconds.",
        s.read_bytes_per_s);
  gauge("read_bandwidth_utilization_perc",
        "read_bandwidth_bytes_per_second over the measured peak read bandwidth (0-1).",
        s.bandwidth_utilization);
  gauge("compute_ops_per_second",
        "Arithmetic ops (FP32 FLOPs + int8 ops) per second of step time, last seconds.",
        s.ops_per_s);
  gauge("compute_utilization_perc",
        "Step time the ops would take at the measured peaks over the step time (0-1).",
        s.compute_utilization);
  gauge("peak_read_bandwidth_bytes_per_second",
        "The machine's read bandwidth, measured at start-up with the widest loads on every "
        "engine thread (or given by flag).",
        s.peak_read_bytes_per_s);
  Header("peng_peak_compute_ops_per_second", "gauge",
         "The machine's arithmetic peak by kind, measured at start-up (or given by flag).", &out);
  Sample("peng_peak_compute_ops_per_second", l + ",kind=\"fp32\"", s.peak_flops_f32_per_s, &out);
  Sample("peng_peak_compute_ops_per_second", l + ",kind=\"int8\"", s.peak_ops_int8_per_s, &out);
  std::lock_guard<std::mutex> lock(mu_);
  Header("peng_request_success_total", "counter", "Count of successfully processed requests.",
         &out);
  for (const auto& [reason, n] : finished_) {
    Sample("peng_request_success_total", l + ",finished_reason=\"" + PromEscape(reason) + "\"",
           static_cast<double>(n), &out);
  }
  Header("peng_time_to_first_token_seconds", "histogram",
         "Histogram of time to first token in seconds.", &out);
  ttft_.Render("peng_time_to_first_token_seconds", l, &out);
  Header("peng_inter_token_latency_seconds", "histogram",
         "Histogram of inter-token latency in seconds.", &out);
  itl_.Render("peng_inter_token_latency_seconds", l, &out);
  Header("peng_e2e_request_latency_seconds", "histogram",
         "Histogram of end to end request latency in seconds.", &out);
  e2e_.Render("peng_e2e_request_latency_seconds", l, &out);
  return out;
}

}  // namespace peng::server
