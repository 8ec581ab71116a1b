// spawnpoint-metrics-bench (make bench-metrics): what a scrape of spawnpoint_metrics costs.
// Renders registries of 10,000 series (counters, gauges, label-heavy GPU-style gauges,
// histograms, and a collector producing its series at scrape time) and reports, per scrape,
// the wall time (median and p99 over the iterations), the heap allocations and bytes (this
// binary replaces operator new to count them), and the size of the text. Also the cost of
// the hot-path updates. Prints tables; flags: --series N (default 10000), --iterations N
// (default 50).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "metrics/registry.h"

namespace {

std::atomic<uint64_t> g_allocs{0};
std::atomic<uint64_t> g_bytes{0};

}  // namespace

// Every allocation of this program goes through these, so a scrape's allocations can be
// counted as the difference of the counters around it (the benchmark is single-threaded
// while it measures a scrape).
void* operator new(std::size_t size) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  g_bytes.fetch_add(size, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return operator new(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  g_bytes.fetch_add(size, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t& t) noexcept {
  return operator new(size, t);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

using spawnpoint::metrics::CollectedFamily;
using spawnpoint::metrics::MetricType;
using spawnpoint::metrics::Registry;
using Clock = std::chrono::steady_clock;

struct Row {
  std::string scenario;
  size_t series = 0;
  size_t lines = 0;
  double kib = 0;
  double p50_ms = 0, p99_ms = 0;
  double allocs = 0, alloc_kib = 0;              // Render(): a new string per scrape
  double reuse_allocs = 0, reuse_alloc_kib = 0;  // RenderTo() into a reused buffer
};

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

Row Measure(const std::string& scenario, size_t series, const Registry& registry, int iterations) {
  Row row;
  row.scenario = scenario;
  row.series = series;
  std::string text = registry.Render();  // warm-up: sizes the reserve hint
  row.lines = static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
  row.kib = text.size() / 1024.0;

  std::vector<double> ms;
  uint64_t allocs = 0, bytes = 0;
  for (int i = 0; i < iterations; ++i) {
    const uint64_t a0 = g_allocs.load(), b0 = g_bytes.load();
    const auto t0 = Clock::now();
    std::string out = registry.Render();
    const auto t1 = Clock::now();
    allocs += g_allocs.load() - a0;
    bytes += g_bytes.load() - b0;
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (out.size() < text.size() / 2) std::abort();  // keeps the render from being elided
  }
  row.p50_ms = Percentile(ms, 0.5);
  row.p99_ms = Percentile(ms, 0.99);
  row.allocs = static_cast<double>(allocs) / iterations;
  row.alloc_kib = static_cast<double>(bytes) / iterations / 1024.0;

  std::string buffer;
  buffer.reserve(text.size() * 2);
  allocs = bytes = 0;
  for (int i = 0; i < iterations; ++i) {
    buffer.clear();
    const uint64_t a0 = g_allocs.load(), b0 = g_bytes.load();
    registry.RenderTo(&buffer);
    allocs += g_allocs.load() - a0;
    bytes += g_bytes.load() - b0;
  }
  row.reuse_allocs = static_cast<double>(allocs) / iterations;
  row.reuse_alloc_kib = static_cast<double>(bytes) / iterations / 1024.0;
  return row;
}

// 10,000 counters in 10 families of 1,000 label sets each (namespace, job, rank).
Row Counters(size_t n, int iterations) {
  Registry r;
  const size_t families = 10, per = n / families;
  for (size_t f = 0; f < families; ++f) {
    auto* c = r.AddCounter({.name = "bench_family_" + std::to_string(f) + "_total",
                            .help = "A benchmark counter.",
                            .labels = {"namespace", "job", "rank"}})
                  .value();
    for (size_t i = 0; i < per; ++i) {
      c->WithLabels(
           {"team-" + std::to_string(i % 7), "job-" + std::to_string(i / 8), std::to_string(i % 8)})
          ->Inc(static_cast<double>(i * 37 + f));
    }
  }
  return Measure("counters, 10 families", families * per, r, iterations);
}

// 10,000 gauges with the agent's ten GPU labels and fractional values.
Row GpuGauges(size_t n, int iterations) {
  Registry r;
  auto* g = r.AddGauge({.name = "bench_gpu_utilisation_ratio",
                        .help = "A benchmark gauge with the GPU labels.",
                        .labels = {"gpu", "UUID", "pci_bus_id", "model_name", "Hostname",
                                   "namespace", "pod", "container", "rank", "job"}})
                .value();
  for (size_t i = 0; i < n; ++i) {
    char uuid[64], bus[32];
    snprintf(uuid, sizeof(uuid), "GPU-6b7c1a2e-0000-4000-8000-%012zx", i);
    snprintf(bus, sizeof(bus), "0000:%02zx:00.0", i % 256);
    g->WithLabels({std::to_string(i % 8), uuid, bus, "NVIDIA A100-SXM4-80GB",
                   "gpu-node-" + std::to_string(i / 8), "ml", "job-" + std::to_string(i / 64),
                   "trainer", std::to_string(i % 64), "job-" + std::to_string(i / 64)})
        ->Set(static_cast<double>(i % 100) / 100.0 + 0.001);
  }
  return Measure("gauges, 10 GPU labels", n, r, iterations);
}

// n / 15 histograms of 12 buckets: n sample lines (12 buckets + +Inf + _sum + _count).
Row Histograms(size_t n, int iterations) {
  Registry r;
  auto* h = r.AddHistogram({.name = "bench_request_duration_seconds",
                            .help = "A benchmark histogram.",
                            .labels = {"verb", "code"}},
                           spawnpoint::metrics::ExponentialBuckets(0.001, 2, 12))
                .value();
  const size_t count = n / 15;
  for (size_t i = 0; i < count; ++i) {
    auto s = h->WithLabels({"verb-" + std::to_string(i % 13), std::to_string(200 + i)});
    for (int k = 0; k < 20; ++k) s->Observe(0.0007 * (k + 1) * (i % 5 + 1));
  }
  return Measure("histograms (" + std::to_string(count) + " x 12 buckets)", count * 15, r,
                 iterations);
}

// 10,000 gauges produced by a collector on every scrape (values read at scrape time).
Row Collected(size_t n, int iterations) {
  Registry r;
  r.AddCollector([n](std::vector<CollectedFamily>* out) {
    CollectedFamily f{.name = "bench_collected_temperature_celsius",
                      .help = "A benchmark collected gauge.",
                      .type = MetricType::kGauge,
                      .label_names = {"gpu", "node"}};
    f.samples.reserve(n);
    for (size_t i = 0; i < n; ++i)
      f.Add({std::to_string(i % 8), std::to_string(i / 8)}, 40 + i % 50);
    out->push_back(std::move(f));
  });
  return Measure("collector, 2 labels", n, r, iterations);
}

void PrintScrapes(const std::vector<Row>& rows, int iterations) {
  printf("\nScrape cost (%d iterations each; p50/p99 of Render(); allocations per scrape)\n\n",
         iterations);
  printf("| %-32s | %7s | %7s | %8s | %8s | %8s | %11s | %11s | %13s |\n", "scenario", "series",
         "lines", "text KiB", "p50 ms", "p99 ms", "allocs", "alloc KiB", "allocs reused");
  printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", std::string(34, '-').c_str(),
         std::string(9, '-').c_str(), std::string(9, '-').c_str(), std::string(10, '-').c_str(),
         std::string(10, '-').c_str(), std::string(10, '-').c_str(), std::string(13, '-').c_str(),
         std::string(13, '-').c_str(), std::string(15, '-').c_str());
  for (const auto& r : rows) {
    printf("| %-32s | %7zu | %7zu | %8.0f | %8.2f | %8.2f | %11.1f | %11.0f | %13.1f |\n",
           r.scenario.c_str(), r.series, r.lines, r.kib, r.p50_ms, r.p99_ms, r.allocs, r.alloc_kib,
           r.reuse_allocs);
  }
}

double NsPerOp(const std::function<void()>& op, int64_t ops) {
  const auto t0 = Clock::now();
  op();
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / ops;
}

void PrintHotPath() {
  Registry r;
  auto* c = r.AddCounter({.name = "hot_total", .help = "h", .labels = {"rank"}}).value();
  auto* h = r.AddHistogram({.name = "hot_seconds", .help = "h"}).value();
  auto counter = c->WithLabels({"0"});
  auto hist = h->WithLabels({});
  constexpr int64_t kOps = 5'000'000;
  const double inc = NsPerOp(
      [&] {
        for (int64_t i = 0; i < kOps; ++i) counter->Inc();
      },
      kOps);
  const double observe = NsPerOp(
      [&] {
        for (int64_t i = 0; i < kOps; ++i) hist->Observe((i & 1023) * 1e-5);
      },
      kOps);
  for (int i = 0; i < 64; ++i) c->WithLabels({std::to_string(i)});
  constexpr int64_t kLookups = 500'000;
  const double lookup = NsPerOp(
      [&] {
        for (int64_t i = 0; i < kLookups; ++i) c->WithLabels({"17"})->Inc();
      },
      kLookups);
  const double contended = NsPerOp(
      [&] {
        std::thread other([&] {
          for (int64_t i = 0; i < kOps; ++i) counter->Inc();
        });
        for (int64_t i = 0; i < kOps; ++i) counter->Inc();
        other.join();
      },
      2 * kOps);
  printf("\nUpdate cost (ns per operation)\n\n");
  printf("| %-46s | %8s |\n", "operation", "ns/op");
  printf("|%s|%s|\n", std::string(48, '-').c_str(), std::string(10, '-').c_str());
  printf("| %-46s | %8.1f |\n", "Counter::Inc on a held series", inc);
  printf("| %-46s | %8.1f |\n", "Counter::Inc, 2 threads on one series", contended);
  printf("| %-46s | %8.1f |\n", "Histogram::Observe (11 buckets)", observe);
  printf("| %-46s | %8.1f |\n", "WithLabels lookup + Inc (64 series)", lookup);
}

}  // namespace

int main(int argc, char** argv) {
  size_t series = 10'000;
  int iterations = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--series" || a == "--iterations") && i + 1 < argc) {
      const long v = std::strtol(argv[++i], nullptr, 10);
      if (v <= 0) {
        fprintf(stderr, "spawnpoint-metrics-bench: %s must be positive\n", a.c_str());
        return 2;
      }
      if (a == "--series") series = static_cast<size_t>(v);
      if (a == "--iterations") iterations = static_cast<int>(v);
    } else if (a == "-h" || a == "--help") {
      printf("usage: spawnpoint-metrics-bench [--series N] [--iterations N]\n");
      return 0;
    } else {
      fprintf(stderr, "spawnpoint-metrics-bench: unknown flag %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  std::vector<Row> rows = {Counters(series, iterations), GpuGauges(series, iterations),
                           Histograms(series, iterations), Collected(series, iterations)};
  PrintScrapes(rows, iterations);
  PrintHotPath();
  return 0;
}
