// spawnpoint-kube-bench: what the Kubernetes client library costs, measured against a real
// kube-apiserver (--kubeconfig: scripts/cluster.sh's control plane, see kube_bench.sh) over
// real HTTP (the production client and transport):
//   - informer cache memory per pod (synthetic store fill, and end-to-end through an
//     informer that listed 10,000 pods), with and without the default managedFields strip;
//   - create, paged list, informer sync (list + store + handlers) and watch throughput.
// Prints a table. Memory is the growth of malloc's in-use bytes (mallinfo2).
#include <malloc.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "operator/kube/client.h"
#include "operator/kube/informer.h"
#include "operator/kube/store.h"
#include "tests/support/test_process.h"

namespace {

using namespace spawnpoint::kube;
using Steady = std::chrono::steady_clock;

struct Flags {
  std::string kubeconfig;  // a running API server's
  int pods = 10000;
  int watch_writes = 5000;
  int writers = 4;
  int page_size = 500;
};

int64_t HeapInUse() {
  malloc_trim(0);
  struct mallinfo2 mi = mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

double Seconds(Steady::duration d) { return std::chrono::duration<double>(d).count(); }

// A pod as a TrainingJob's controller creates it and the kubelet reports it: labels,
// an owner reference, one container with env, resources and mounts, volumes, tolerations,
// status with conditions and a container status, and the managedFields of three managers.
Json RealisticPod(const std::string& ns, int i) {
  std::string name = "resnet-ddp-" + std::to_string(i / 8) + "-node-" + std::to_string(i % 8);
  Json env = Json::array();
  for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NNODES",
                        "NODE_RANK", "SPAWNPOINT_LOADER_WORKERS"}) {
    env.push_back({{"name", k}, {"value", std::to_string(i % 97)}});
  }
  Json managed = Json::array();
  for (const char* m : {"spawnpoint-operator", "kube-scheduler", "kubelet"}) {
    managed.push_back(
        {{"manager", m},
         {"operation", "Update"},
         {"apiVersion", "v1"},
         {"time", "2024-05-01T10:00:00Z"},
         {"fieldsType", "FieldsV1"},
         {"fieldsV1",
          {{"f:metadata", {{"f:labels", {{"f:app", Json::object()}, {"f:job", Json::object()}}}}},
           {"f:spec", {{"f:containers", {{"k:{\"name\":\"trainer\"}", {{".", Json::object()}}}}}}},
           {"f:status", {{"f:conditions", Json::object()}, {"f:phase", Json::object()}}}}}});
  }
  return {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", name},
        {"namespace", ns},
        {"uid", "0f3c2a9e-1b2d-4c5e-8f70-" + std::to_string(100000000000 + i)},
        {"resourceVersion", std::to_string(1000 + i)},
        {"creationTimestamp", "2024-05-01T10:00:00Z"},
        {"labels",
         {{"app.kubernetes.io/name", "spawnpoint"},
          {"spawnpoint.dev/job", "resnet-ddp-" + std::to_string(i / 8)},
          {"spawnpoint.dev/node-rank", std::to_string(i % 8)},
          {"spawnpoint.dev/attempt", "0"}}},
        {"annotations", {{"spawnpoint.dev/plan-hash", "9f8e7d6c5b4a39281706f5e4d3c2b1a0"}}},
        {"ownerReferences",
         {{{"apiVersion", "spawnpoint.dev/v1alpha1"},
           {"kind", "TrainingJob"},
           {"name", "resnet-ddp-" + std::to_string(i / 8)},
           {"uid", "7a6b5c4d-3e2f-1a0b-9c8d-" + std::to_string(200000000000 + i / 8)},
           {"controller", true},
           {"blockOwnerDeletion", true}}}},
        {"managedFields", managed}}},
      {"spec",
       {{"nodeName", "gpu-node-" + std::to_string(i % 64)},
        {"restartPolicy", "Never"},
        {"schedulerName", "default-scheduler"},
        {"serviceAccountName", "default"},
        {"terminationGracePeriodSeconds", 30},
        {"containers",
         {{{"name", "trainer"},
           {"image", "registry.example.com/ml/resnet-ddp:2024.05.01"},
           {"command", {"/opt/spawnpoint/bin/spawnpoint-agent", "run", "--plan-from-env"}},
           {"args", {"--", "python", "train.py", "--epochs", "90", "--batch-size", "256"}},
           {"env", env},
           {"resources",
            {{"limits", {{"nvidia.com/gpu", "4"}, {"memory", "64Gi"}, {"cpu", "32"}}},
             {"requests", {{"nvidia.com/gpu", "4"}, {"memory", "64Gi"}, {"cpu", "32"}}}}},
           {"volumeMounts",
            {{{"name", "dshm"}, {"mountPath", "/dev/shm"}},
             {{"name", "kube-api-access"},
              {"mountPath", "/var/run/secrets/kubernetes.io/serviceaccount"},
              {"readOnly", true}}}},
           {"ports", {{{"name", "rendezvous"}, {"containerPort", 29500}, {"protocol", "TCP"}}}},
           {"terminationMessagePath", "/dev/termination-log"},
           {"terminationMessagePolicy", "File"},
           {"imagePullPolicy", "IfNotPresent"}}}},
        {"volumes",
         {{{"name", "dshm"}, {"emptyDir", {{"medium", "Memory"}, {"sizeLimit", "8Gi"}}}},
          {{"name", "kube-api-access"},
           {"projected",
            {{"sources",
              {{{"serviceAccountToken", {{"path", "token"}, {"expirationSeconds", 3607}}}}}}}}}}},
        {"tolerations",
         {{{"key", "nvidia.com/gpu"}, {"operator", "Exists"}, {"effect", "NoSchedule"}},
          {{"key", "node.kubernetes.io/not-ready"},
           {"operator", "Exists"},
           {"effect", "NoExecute"},
           {"tolerationSeconds", 300}}}}}},
      {"status",
       {{"phase", "Running"},
        {"hostIP", "10.0." + std::to_string(i % 64) + ".10"},
        {"podIP", "10.244." + std::to_string(i % 250) + "." + std::to_string(i % 200 + 2)},
        {"startTime", "2024-05-01T10:00:05Z"},
        {"qosClass", "Guaranteed"},
        {"conditions",
         {{{"type", "Initialized"},
           {"status", "True"},
           {"lastTransitionTime", "2024-05-01T10:00:05Z"}},
          {{"type", "Ready"}, {"status", "True"}, {"lastTransitionTime", "2024-05-01T10:00:20Z"}},
          {{"type", "ContainersReady"},
           {"status", "True"},
           {"lastTransitionTime", "2024-05-01T10:00:20Z"}},
          {{"type", "PodScheduled"},
           {"status", "True"},
           {"lastTransitionTime", "2024-05-01T10:00:01Z"}}}},
        {"containerStatuses",
         {{{"name", "trainer"},
           {"ready", true},
           {"restartCount", 0},
           {"started", true},
           {"image", "registry.example.com/ml/resnet-ddp:2024.05.01"},
           {"imageID",
            "registry.example.com/ml/"
            "resnet-ddp@sha256:4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c"},
           {"containerID", "containerd://" + std::string(64, 'a')},
           {"state", {{"running", {{"startedAt", "2024-05-01T10:00:19Z"}}}}}}}}}}};
}

struct Row {
  std::string what;
  std::string value;
};

void Print(const std::vector<Row>& rows) {
  size_t w = 0;
  for (const auto& r : rows) w = std::max(w, r.what.size());
  std::printf("\n| %-*s | %s\n|-%s-|-%s\n", static_cast<int>(w), "measurement", "value",
              std::string(w, '-').c_str(), std::string(30, '-').c_str());
  for (const auto& r : rows) {
    std::printf("| %-*s | %s\n", static_cast<int>(w), r.what.c_str(), r.value.c_str());
  }
}

std::string Fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// What a pod controller typically needs of a pod: identity, labels, owners, the node, and
// the status that says how it is doing. An example of InformerOptions::transform.
void TrimPod(Json& pod) {
  StripManagedFields(pod);
  pod["metadata"].erase("annotations");
  Json spec = {{"nodeName", pod["spec"].value("nodeName", "")}};
  pod["spec"] = std::move(spec);
  auto& st = pod["status"];
  for (const char* k : {"conditions", "qosClass", "startTime"}) st.erase(k);
  for (auto& cs : st["containerStatuses"]) {
    for (const char* k : {"image", "imageID", "containerID"}) cs.erase(k);
  }
}

// Fills a Store the way an informer does and reports the heap growth per object.
double StoreBytesPerPod(int n, const std::function<void(Json&)>& transform, double* text_bytes) {
  std::vector<std::string> texts;
  texts.reserve(n);
  size_t total = 0;
  for (int i = 0; i < n; ++i) {
    texts.push_back(RealisticPod("bench", i).dump());
    total += texts.back().size();
  }
  *text_bytes = static_cast<double>(total) / n;
  int64_t before = HeapInUse();
  auto store = std::make_unique<Store>();
  std::vector<ObjectPtr> objects;
  objects.reserve(n);
  for (const auto& t : texts) {
    Json j = Json::parse(t);
    if (transform) transform(j);
    objects.push_back(std::make_shared<const Json>(std::move(j)));
  }
  store->Replace(std::move(objects));
  int64_t after = HeapInUse();
  return static_cast<double>(after - before) / n;
}

int Run(const Flags& f) {
  std::vector<Row> rows;
  double text = 0;
  double raw = StoreBytesPerPod(f.pods, nullptr, &text);
  double stripped = StoreBytesPerPod(f.pods, StripManagedFields, &text);
  double trimmed = StoreBytesPerPod(f.pods, TrimPod, &text);
  rows.push_back({"pod JSON size (with managedFields)", Fmt("%.0f bytes", text)});
  rows.push_back({"store memory per pod, kept as is", Fmt("%.0f bytes", raw)});
  rows.push_back(
      {"store memory per pod, managedFields stripped (default)", Fmt("%.0f bytes", stripped)});
  rows.push_back(
      {"store memory per 10,000 pods (default)", Fmt("%.1f MiB", stripped * 10000 / 1048576)});
  rows.push_back(
      {"store memory per pod, trimmed to what a controller reads", Fmt("%.0f bytes", trimmed)});
  rows.push_back(
      {"store memory per 10,000 pods (trimmed)", Fmt("%.1f MiB", trimmed * 10000 / 1048576)});

  const std::string& kubeconfig = f.kubeconfig;
  const std::string against = "a real API server (" + f.kubeconfig + ")";
  auto config = LoadKubeconfig(kubeconfig);
  if (!config.ok()) {
    std::cerr << config.status().ToString() << "\n";
    return 1;
  }
  ClientOptions co;
  co.qps = 0;  // measure the client, not the limiter
  auto client_or = Client::Connect(*config, co);
  if (!client_or.ok()) {
    std::cerr << client_or.status().ToString() << "\n";
    return 1;
  }
  Client& client = **client_or;
  const std::string ns = "bench";
  if (auto r = client.Create(
          resources::Namespaces(),
          {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
      !r.ok()) {
    std::cerr << r.status().ToString() << "\n";
    return 1;
  }

  // Create the pods from several threads.
  std::atomic<int> next{0}, failures{0};
  auto t0 = Steady::now();
  std::vector<std::thread> writers;
  for (int w = 0; w < f.writers; ++w) {
    writers.emplace_back([&] {
      for (int i = next++; i < f.pods; i = next++) {
        Json pod = RealisticPod(ns, i);
        pod["metadata"].erase("resourceVersion");
        pod["metadata"].erase("uid");
        pod["metadata"].erase("managedFields");
        if (!client.Create(resources::Pods(), pod).ok()) ++failures;
      }
    });
  }
  for (auto& t : writers) t.join();
  double create_s = Seconds(Steady::now() - t0);
  if (failures) std::cerr << failures << " creates failed\n";
  rows.push_back(
      {"create " + std::to_string(f.pods) + " pods (" + std::to_string(f.writers) + " threads)",
       Fmt("%.0f objects/s", f.pods / create_s)});

  t0 = Steady::now();
  auto list = client.ListAll(resources::Pods(), ns, {.limit = f.page_size});
  double list_s = Seconds(Steady::now() - t0);
  if (!list.ok()) {
    std::cerr << list.status().ToString() << "\n";
    return 1;
  }
  rows.push_back({"paged list (" + std::to_string(f.page_size) + " per page)",
                  Fmt("%.0f objects/s", list->items.size() / list_s)});
  list = ObjectList{};

  // Informer: list + store + handlers, then watch.
  int64_t heap_before = HeapInUse();
  InformerOptions io;
  io.namespaces = {ns};
  io.reflector.page_size = f.page_size;
  Informer inf(&client, resources::Pods(), io);
  std::atomic<int64_t> adds{0}, updates{0};
  std::atomic<int64_t> last_event_ns{0};
  inf.AddEventHandler({.on_add = [&](const ObjectPtr&) { ++adds; },
                       .on_update =
                           [&](const ObjectPtr&, const ObjectPtr&) {
                             ++updates;
                             last_event_ns = Steady::now().time_since_epoch().count();
                           },
                       .on_delete = nullptr});
  t0 = Steady::now();
  inf.Start();
  if (!inf.WaitForSync(std::chrono::minutes(5))) {
    std::cerr << "informer did not sync\n";
    return 1;
  }
  double sync_s = Seconds(Steady::now() - t0);
  int64_t heap_after = HeapInUse();
  rows.push_back(
      {"informer sync (list + store + handlers)", Fmt("%.0f objects/s", adds.load() / sync_s)});
  rows.push_back({"informer heap growth per pod (end to end)",
                  Fmt("%.0f bytes", static_cast<double>(heap_after - heap_before) / f.pods)});

  // Watch: writers patch pods as fast as they can; the informer sees every change.
  const std::string rv_before_patches = inf.LastResourceVersion();
  next = 0;
  t0 = Steady::now();
  writers.clear();
  for (int w = 0; w < f.writers; ++w) {
    writers.emplace_back([&] {
      for (int i = next++; i < f.watch_writes; i = next++) {
        std::string name = "resnet-ddp-" + std::to_string((i % f.pods) / 8) + "-node-" +
                           std::to_string((i % f.pods) % 8);
        Json patch = {{"metadata", {{"labels", {{"bench/seq", std::to_string(i)}}}}}};
        if (!client.Patch(resources::Pods(), ns, name, patch).ok()) ++failures;
      }
    });
  }
  for (auto& t : writers) t.join();
  double write_s = Seconds(Steady::now() - t0);
  bool all = spawnpoint::testing::WaitUntil([&] { return updates.load() >= f.watch_writes; },
                                            std::chrono::minutes(2));
  double watch_s = Seconds(Steady::duration(last_event_ns.load()) - t0.time_since_epoch());
  rows.push_back({"patches written (" + std::to_string(f.watch_writes) + ", " +
                      std::to_string(f.writers) + " threads)",
                  Fmt("%.0f objects/s", f.watch_writes / write_s)});
  rows.push_back({"watch events delivered to handlers",
                  all ? Fmt("%.0f objects/s", updates.load() / watch_s)
                      : "incomplete: " + std::to_string(updates.load())});
  rows.push_back(
      {"last event after last write", Fmt("%.1f ms", std::max(0.0, watch_s - write_s) * 1000)});
  inf.Stop();

  // Replay: a watch from before the patches streams them all back as fast as it can read.
  t0 = Steady::now();
  auto stream = client.Watch(resources::Pods(), ns,
                             {.resource_version = rv_before_patches, .allow_bookmarks = false});
  int64_t replayed = 0;
  while (stream.ok() && replayed < f.watch_writes) {
    auto ev = (*stream)->Next();
    if (!ev.ok() || !ev->has_value()) {
      std::cerr << "replay ended early: " << ev.status().ToString() << "\n";
      break;
    }
    ++replayed;
  }
  double replay_s = Seconds(Steady::now() - t0);
  if (stream.ok()) (*stream)->Cancel();
  rows.push_back({"watch replay (decode " + std::to_string(replayed) + " events)",
                  Fmt("%.0f objects/s", replayed / replay_s)});

  std::printf("spawnpoint-kube-bench: %d pods, %d watched patches, against %s\n", f.pods,
              f.watch_writes, against.c_str());
  Print(rows);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--kubeconfig") {
      f.kubeconfig = value();
    } else if (a == "--pods") {
      f.pods = std::stoi(value());
    } else if (a == "--watch-writes") {
      f.watch_writes = std::stoi(value());
    } else if (a == "--writers") {
      f.writers = std::stoi(value());
    } else if (a == "--page-size") {
      f.page_size = std::stoi(value());
    } else {
      std::cerr << "usage: spawnpoint-kube-bench --kubeconfig PATH [--pods N] "
                   "[--watch-writes N] [--writers N] [--page-size N]\n";
      return a == "--help" ? 0 : 2;
    }
  }
  if (f.kubeconfig.empty()) {
    std::cerr << "spawnpoint-kube-bench: --kubeconfig PATH (a running API server; "
                 "bench/kube/kube_bench.sh starts one) is required\n";
    return 2;
  }
  return Run(f);
}
