#include "bench/zero_breakdown.h"

#include <fmt/format.h>
#include <httplib.h>

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "bench/memcpy_rate.h"
#include "bench/stopwatch.h"
#include "kernels/cpu/adam.h"
#include "metrics/state_figures.h"

namespace dsactor::bench {

namespace {

// The phases service_phases.h counts, in the order of a step.
constexpr const char* kServicePhases[] = {"receive", "checksum", "accumulate", "adam",
                                          "serve",   "commit",   "metadata"};

double ms(const nlohmann::json& j, const char* key) {
  return j.at(key).get<double>() * 1e-3;
}

double process_cpu_seconds_total() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

struct AdamKernelRate {
  double params_per_s;           // wall
  double cpu_seconds_per_param;  // all its threads
};

// The Adam kernel (AdamW, no half copy) over n parameters. On a loaded machine its wall time
// stretches with the neighbours' load, its CPU time much less, and the service's cost it is
// compared with is CPU time too.
AdamKernelRate adam_kernel_rate(size_t n) {
  std::vector<float> p(n, 0.5f), m(n, 0.0f), v(n, 0.0f), g(n, 1e-3f);
  kernels::cpu::AdamHyper h;
  h.lr = 1e-4f;
  h.weight_decay = 0.01f;
  h.adamw_mode = true;
  h.bias_correction = true;
  kernels::cpu::adam_step(p.data(), m.data(), v.data(), g.data(), n, h, 1, 1.0f);  // warm
  constexpr int kIters = 3;
  const double cpu0 = process_cpu_seconds_total();
  const auto t0 = Clock::now();
  for (int t = 2; t < 2 + kIters; ++t)
    kernels::cpu::adam_step(p.data(), m.data(), v.data(), g.data(), n, h, t, 1.0f);
  const double wall = seconds_since(t0);
  const double stepped = static_cast<double>(n) * kIters;  // parameters updated
  return {stepped / wall, (process_cpu_seconds_total() - cpu0) / stepped};
}

}  // namespace

nlohmann::json machine_rates(size_t model_parameters, bool one_thread_too) {
  // The reference is the kernel on the model's own parameter count, as the service's pass
  // is: gpt2's 124M parameters stream 3.5 GB from memory, where 4M (64 MiB of state) mostly
  // stay in this machine's caches and step faster. The in-cache rate is kept beside it for
  // comparison with `bench adam`.
  const size_t n = std::max<size_t>(model_parameters, 1);
  const AdamKernelRate model = adam_kernel_rate(n);
  const AdamKernelRate in_cache = adam_kernel_rate(size_t{1} << 22);
  const int threads = omp_get_max_threads();
  nlohmann::json rates = {{"memcpy_bytes_per_s", warm_memcpy_bytes_per_second()},
                          {"adam_params_per_s", model.params_per_s},
                          {"adam_cpu_seconds_per_param", model.cpu_seconds_per_param},
                          {"adam_kernel_parameters", model_parameters},
                          {"adam_in_cache_params_per_s", in_cache.params_per_s},
                          {"adam_in_cache_cpu_seconds_per_param", in_cache.cpu_seconds_per_param},
                          {"adam_threads", threads},
                          {"adam_isa", kernels::cpu::adam_isa()}};
  if (one_thread_too) {
    // A service on a core of its own runs its Adam pass on one OpenMP thread.
    omp_set_num_threads(1);
    const AdamKernelRate one_thread = adam_kernel_rate(n);
    omp_set_num_threads(threads);
    rates["adam_one_thread_params_per_s"] = one_thread.params_per_s;
    rates["adam_one_thread_cpu_seconds_per_param"] = one_thread.cpu_seconds_per_param;
  }
  return rates;
}

nlohmann::json mean_rates(const std::vector<nlohmann::json>& samples) {
  if (samples.empty()) throw std::invalid_argument("mean_rates: no samples");
  nlohmann::json out = samples.front();
  for (auto& [key, value] : out.items()) {
    // Counts and names (the kernel's parameters, threads, ISA) are the same in every sample.
    if (!value.is_number_float()) continue;
    double sum = 0;
    for (const auto& s : samples) sum += s.at(key).get<double>();
    value = sum / static_cast<double>(samples.size());
  }
  out["samples"] = samples;
  return out;
}

nlohmann::json scrape_service_state(const std::string& metrics_url) {
  httplib::Client client(metrics_url);
  client.set_read_timeout(30, 0);
  auto res = client.Get("/api/state");
  if (!res || res->status != 200)
    throw std::runtime_error(fmt::format("bench zero: {}/api/state did not answer", metrics_url));
  return nlohmann::json::parse(res->body);
}

nlohmann::json service_phases_per_step(const nlohmann::json& before, const nlohmann::json& after,
                                       int steps) {
  nlohmann::json out;
  for (const char* phase : kServicePhases) {
    auto delta = [&](const char* metric) {
      const metrics::Labels labels{{"phase", phase}};
      return (metrics::sum_of(after, metric, labels) - metrics::sum_of(before, metric, labels)) /
             steps;
    };
    out[phase] = {{"seconds", delta("dsactor_offload_phase_seconds_total")},
                  {"cpu_seconds", delta("dsactor_offload_phase_cpu_seconds_total")},
                  {"bytes", delta("dsactor_offload_phase_bytes_total")},
                  {"operations", delta("dsactor_offload_phase_operations_total")}};
  }
  return out;
}

nlohmann::json step_breakdown(const nlohmann::json& s3, const nlohmann::json& rates,
                              size_t parameters) {
  const double step = ms(s3, "ms_per_step");
  const double memcpy_rate = rates.at("memcpy_bytes_per_s").get<double>();
  const double adam_rate = rates.at("adam_params_per_s").get<double>();
  auto row = [&](double seconds, double bytes) {
    nlohmann::json r = {
        {"seconds", seconds}, {"fraction_of_step", seconds / step}, {"bytes", bytes}};
    if (bytes > 0 && seconds > 0) r["rate_over_memcpy"] = bytes / seconds / memcpy_rate;
    return r;
  };
  nlohmann::json trainer;
  const double fetch_wait = ms(s3, "fetch_wait_ms");
  const double push = ms(s3, "push_wait_ms"), commit = ms(s3, "commit_wait_ms");
  // The fetch waits happen inside the forward and the backward: compute is what is left.
  const double compute = ms(s3, "forward_ms") + ms(s3, "backward_ms") - fetch_wait;
  trainer["fetch_wait"] = row(fetch_wait, s3.at("bytes_fetched_per_step").get<double>());
  trainer["forward_backward_compute"] = row(compute, 0);
  trainer["push_wait"] = row(push, s3.at("bytes_pushed_per_step").get<double>());
  trainer["commit_wait"] = row(commit, 0);
  trainer["other"] = row(step - fetch_wait - compute - push - commit, 0);

  const nlohmann::json& phases = s3.at("service_phases");
  nlohmann::json service;
  for (const char* phase : kServicePhases) {
    const auto& p = phases.at(phase);
    service[phase] = row(p.at("seconds").get<double>(), p.at("bytes").get<double>());
    service[phase]["cpu_seconds"] = p.at("cpu_seconds");
  }
  // The commit's coordination: what the commit took besides the metadata writes (counted
  // inside it). Answered behind the reply, the RAM tier's Adam passes run after it, as the
  // workers publish the step; answered before it (by_host here), its wall time holds them
  // while its coordinator thread waits, so its CPU still does not.
  const double commit_other =
      service["commit"]["seconds"].get<double>() - service["metadata"]["seconds"].get<double>();
  // In CPU time the Adam passes ran on the workers' threads, not the coordinator's.
  const double commit_other_cpu = service["commit"]["cpu_seconds"].get<double>() -
                                  service["metadata"]["cpu_seconds"].get<double>();
  service.erase("commit");
  service["commit_other"] = row(commit_other, 0);
  service["commit_other"]["cpu_seconds"] = commit_other_cpu;
  // Its own row against the kernel's rate: the bytes of an Adam pass are its fp32 params.
  auto& adam = service["adam"];
  const double adam_s = adam["seconds"].get<double>();
  if (adam_s > 0)
    adam["rate_over_adam_kernel"] = adam["bytes"].get<double>() / 4 / adam_s / adam_rate;
  adam.erase("rate_over_memcpy");
  // The kernel's CPU time on the model's parameters, in this run.
  const double kernel_s =
      static_cast<double>(parameters) * rates.at("adam_cpu_seconds_per_param").get<double>();
  const double cpu_s = ms(s3, "service_cpu_ms_per_step");
  // The service's CPU that no phase counted (its threads besides the workers' and the
  // coordinator's: the gateway, ZeroMQ's I/O, the actor system), by difference.
  double counted_cpu_s = 0;
  for (const auto& [name, r] : service.items()) counted_cpu_s += r.at("cpu_seconds").get<double>();
  return {{"step_seconds", step},
          {"trainer", trainer},
          {"service", service},
          {"service_cpu_seconds_per_step", cpu_s},
          {"adam_kernel_seconds_for_model", kernel_s},
          {"service_cpu_over_adam_kernel", cpu_s / kernel_s},
          {"service_cpu_outside_phases_seconds", cpu_s - counted_cpu_s},
          {"service_cpu_ms_per_step_by_thread", s3.at("service_cpu_ms_per_step_by_thread")},
          {"trainer_cpu_ms_per_step_by_thread", s3.at("trainer_cpu_ms_per_step_by_thread")},
          {"service_runs_per_step_by_thread", s3.at("service_runs_per_step_by_thread")},
          {"trainer_runs_per_step_by_thread", s3.at("trainer_runs_per_step_by_thread")},
          {"service_requests_per_step", s3.at("service_requests_per_step")},
          {"service_cpu_goal", 2.0},
          {"trainer_minor_faults_per_step", s3.at("minor_faults_per_step")},
          {"service_minor_faults_per_step", s3.at("service_minor_faults_per_step")},
          {"memcpy_bytes_per_s", memcpy_rate},
          {"adam_params_per_s", adam_rate}};
}

std::string breakdown_table(const nlohmann::json& b) {
  std::string out = fmt::format(
      "stage 3 + offload, per step ({:.1f} ms): wall ms, fraction of the step, the counting "
      "threads' CPU ms (Adam's with its OpenMP helpers), bytes, rate over a warm memcpy ({:.2f} "
      "GB/s) or the Adam kernel "
      "({:.2f} Gparams/s)\n",
      b.at("step_seconds").get<double>() * 1e3, b.at("memcpy_bytes_per_s").get<double>() * 1e-9,
      b.at("adam_params_per_s").get<double>() * 1e-9);
  auto rows = [&](const char* side) {
    for (const auto& [name, r] : b.at(side).items()) {
      std::string rate;
      if (r.contains("rate_over_memcpy"))
        rate = fmt::format("{:.2f}x memcpy", r.at("rate_over_memcpy").get<double>());
      if (r.contains("rate_over_adam_kernel"))
        rate = fmt::format("{:.2f}x adam kernel", r.at("rate_over_adam_kernel").get<double>());
      const std::string cpu =
          r.contains("cpu_seconds")
              ? fmt::format("{:9.1f} cpu", r.at("cpu_seconds").get<double>() * 1e3)
              : std::string(13, ' ');
      out +=
          fmt::format("  {:8} {:26} {:9.1f} ms {:6.3f} {} {:10.1f} MiB  {}\n", side, name,
                      r.at("seconds").get<double>() * 1e3, r.at("fraction_of_step").get<double>(),
                      cpu, r.at("bytes").get<double>() / (1 << 20), rate);
    }
  };
  rows("trainer");
  rows("service");
  out += fmt::format(
      "  service CPU {:.1f} ms per step = {:.2f}x the Adam kernel's CPU on the model, {:.1f} ms "
      "(goal <= {:.0f}x)\n",
      b.at("service_cpu_seconds_per_step").get<double>() * 1e3,
      b.at("service_cpu_over_adam_kernel").get<double>(),
      b.at("adam_kernel_seconds_for_model").get<double>() * 1e3,
      b.at("service_cpu_goal").get<double>());
  out += fmt::format("  of it outside every phase: {:.1f} ms (its other threads)\n",
                     b.at("service_cpu_outside_phases_seconds").get<double>() * 1e3);
  for (const char* side : {"service", "trainer"}) {
    // Each thread's CPU, and in brackets the times it was put on a CPU (where the kernel
    // counts them).
    const auto& runs = b.at(std::string(side) + "_runs_per_step_by_thread");
    std::string threads;
    for (const auto& [name, ms] : b.at(std::string(side) + "_cpu_ms_per_step_by_thread").items()) {
      threads += fmt::format(" {} {:.0f}", name, ms.get<double>());
      if (runs.contains(name))
        threads += fmt::format(" ({:.0f} runs)", runs.at(name).get<double>());
      threads += ',';
    }
    if (!threads.empty()) threads.pop_back();
    out += fmt::format("  {} CPU ms per step by thread:{}\n", side, threads);
  }
  out += fmt::format("  requests the service's gateway decoded per step: {:.1f}\n",
                     b.at("service_requests_per_step").get<double>());
  out += fmt::format("  minor page faults per step: trainer {:.0f}, service {:.0f}\n",
                     b.at("trainer_minor_faults_per_step").get<double>(),
                     b.at("service_minor_faults_per_step").get<double>());
  return out;
}

}  // namespace dsactor::bench
