#include "tests/apiserver/nodes.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "agent/process/spawner.h"
#include "tests/apiserver/table.h"

extern char** environ;

namespace spawnpoint::kubetest {

struct NodeSimulator::Proc {
  pid_t pid = -1;
  int pidfd = -1;
  std::string uid, ns, name, node, container;
  std::string dir, log_path, term_path;
  std::string term_policy;
  std::string restart_policy;
  std::string started_at;
  int restart_count = 0;
  bool term_sent = false;
  bool kill_sent = false;
  std::chrono::steady_clock::time_point kill_deadline =
      std::chrono::steady_clock::time_point::max();
};

namespace {

using Clock = std::chrono::steady_clock;

std::string Now() { return FormatTimestamp(std::chrono::system_clock::now()); }

const json& Spec(const json& pod) {
  static const json kEmpty = json::object();
  auto it = pod.find("spec");
  return it != pod.end() && it->is_object() ? *it : kEmpty;
}

std::string MetaStr(const json& o, const char* key) {
  auto m = o.find("metadata");
  if (m == o.end() || !m->is_object()) return "";
  auto it = m->find(key);
  return it != m->end() && it->is_string() ? it->get<std::string>() : "";
}

size_t MainContainer(const json& pod) {
  const json containers = Spec(pod).value("containers", json::array());
  for (size_t i = 0; i < containers.size(); ++i) {
    if (containers[i].value("name", "") == "trainer") return i;
  }
  return 0;
}

json Conditions(bool ready, const std::string& now) {
  std::string r = ready ? "True" : "False";
  json conds = json::array();
  for (const auto& [type, status] :
       std::vector<std::pair<std::string, std::string>>{{"PodReadyToStartContainers", "True"},
                                                        {"Initialized", "True"},
                                                        {"Ready", r},
                                                        {"ContainersReady", r},
                                                        {"PodScheduled", "True"}}) {
    conds.push_back({{"type", type},
                     {"status", status},
                     {"lastProbeTime", nullptr},
                     {"lastTransitionTime", now}});
  }
  return conds;
}

// $(VAR) expansion as the kubelet does it: known variables are replaced, $$ escapes a
// dollar, unknown references stay as written.
std::string Expand(const std::string& s, const std::map<std::string, std::string>& vars) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '$' && i + 1 < s.size() && s[i + 1] == '$') {
      out.push_back('$');
      ++i;
    } else if (s[i] == '$' && i + 1 < s.size() && s[i + 1] == '(') {
      size_t close = s.find(')', i + 2);
      if (close == std::string::npos) {
        out += s.substr(i);
        break;
      }
      std::string name = s.substr(i + 2, close - i - 2);
      auto it = vars.find(name);
      out += it != vars.end() ? it->second : s.substr(i, close - i + 1);
      i = close;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
  return s;
}

std::string ReadSmallFile(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() > limit) data.resize(limit);
  return data;
}

std::string LogTail(const std::string& path) {
  std::string data = ReadSmallFile(path, 64 << 20);
  size_t lines = 0, pos = data.size();
  while (pos > 0 && lines < 80) {
    pos = data.rfind('\n', pos - 1);
    if (pos == std::string::npos) {
      pos = 0;
      break;
    }
    ++lines;
  }
  std::string tail = data.substr(pos == 0 ? 0 : pos + 1);
  if (tail.size() > 2048) tail = tail.substr(tail.size() - 2048);
  return tail;
}

std::string Base64DecodeLoose(const std::string& in) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z')
      v = c - 'A';
    else if (c >= 'a' && c <= 'z')
      v = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      v = c - '0' + 52;
    else if (c == '+')
      v = 62;
    else if (c == '/')
      v = 63;
    else
      continue;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

}  // namespace

NodeSimulator::NodeSimulator(Store* store, Options options)
    : store_(store), options_(std::move(options)) {}

NodeSimulator::~NodeSimulator() { Stop(); }

Status NodeSimulator::Start() {
  auto node_info = store_->registry()->Find("", "v1", "nodes");
  auto pod_info = store_->registry()->Find("", "v1", "pods");
  for (int i = 0; i < options_.nodes; ++i) {
    std::string name = "node-" + std::to_string(i);
    node_names_.push_back(name);
    std::string now = Now();
    json node = {
        {"metadata",
         {{"name", name},
          {"labels", {{"kubernetes.io/hostname", name}, {"kubernetes.io/os", "linux"}}}}},
        {"spec", json::object()},
        {"status",
         {{"conditions",
           {{{"type", "Ready"},
             {"status", "True"},
             {"reason", "KubeletReady"},
             {"message", "kubelet is posting ready status (simulated)"},
             {"lastHeartbeatTime", now},
             {"lastTransitionTime", now}}}},
          {"addresses",
           {{{"type", "InternalIP"},
             {"address", options_.run_pods ? "127.0.0.1" : "10.0.0." + std::to_string(i + 1)}},
            {{"type", "Hostname"}, {"address", name}}}},
          {"capacity", {{"cpu", "8"}, {"memory", "32Gi"}, {"pods", "110"}}},
          {"allocatable", {{"cpu", "8"}, {"memory", "32Gi"}, {"pods", "110"}}}}}};
    try {
      store_->Create(*node_info, "", node, WriteOptions{});
    } catch (const ApiError& e) {
      return Internal("cannot create node " + name + ": " + e.message());
    }
  }
  if (options_.run_pods) {
    work_root_ = options_.work_root;
    if (work_root_.empty()) {
      std::string tmpl =
          (std::filesystem::temp_directory_path() / "kube-test-server-XXXXXX").string();
      if (mkdtemp(tmpl.data()) == nullptr) {
        return Internal(std::string("mkdtemp for pod directories: ") + strerror(errno));
      }
      work_root_ = tmpl;
      own_work_root_ = true;
    }
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    store_->SetPodGracefulDeletion(
        [this](const json& pod) { return ProcessAlive(MetaStr(pod, "uid")); });
    process_thread_ = std::thread([this] { ProcessLoop(); });
  }
  watcher_ = store_->Watch(*pod_info, "", ListOptions{}, "");
  watch_thread_ = std::thread([this] { WatchLoop(); });
  return Status::Ok();
}

void NodeSimulator::Stop() {
  if (stopping_.exchange(true)) return;
  if (watcher_) watcher_->Stop();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (process_thread_.joinable()) {
    uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof(one)) < 0) {
      // The loop also wakes on its own every 100 ms.
    }
    process_thread_.join();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  wake_fd_ = -1;
  if (own_work_root_) {
    std::error_code ec;
    std::filesystem::remove_all(work_root_, ec);
  }
}

std::string NodeSimulator::Logs(const std::string& ns, const std::string& name) {
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = log_paths_.find(ns + "/" + name);
    if (it == log_paths_.end()) return "";
    path = it->second;
  }
  return ReadSmallFile(path, 64 << 20);
}

bool NodeSimulator::ProcessAlive(const std::string& uid) {
  std::lock_guard<std::mutex> lock(mu_);
  return procs_.count(uid) != 0;
}

void NodeSimulator::Enqueue(Command c) {
  std::lock_guard<std::mutex> lock(mu_);
  commands_.push_back(std::move(c));
  uint64_t one = 1;
  if (wake_fd_ >= 0 && write(wake_fd_, &one, sizeof(one)) < 0) {
    // Best effort: the loop polls with a short timeout anyway.
  }
}

void NodeSimulator::WatchLoop() {
  while (!stopping_) {
    WatchEvent ev;
    auto r = watcher_->Next(&ev, Clock::now() + std::chrono::seconds(1));
    if (r == Watcher::Result::kStopped) break;
    if (r == Watcher::Result::kEvent) OnPod(ev.type, ev.object);
  }
}

void NodeSimulator::OnPod(const std::string& type, const json& pod) {
  const std::string uid = MetaStr(pod, "uid");
  const std::string ns = MetaStr(pod, "namespace");
  const std::string name = MetaStr(pod, "name");
  if (type == "DELETED") {
    if (options_.run_pods && ProcessAlive(uid)) Enqueue(Command{Command::kKill, pod, uid, 0});
    std::lock_guard<std::mutex> lock(mu_);
    started_.erase(uid);
    return;
  }
  const json& meta = pod["metadata"];
  if (meta.contains("deletionTimestamp")) {
    if (options_.run_pods && ProcessAlive(uid)) {
      Enqueue(Command{Command::kKill, pod, uid, meta.value("deletionGracePeriodSeconds", 30)});
    } else if (meta.value("deletionGracePeriodSeconds", 0) > 0) {
      store_->FinishPodTermination(ns, name, uid);
    }
    return;
  }
  const json& spec = Spec(pod);
  std::string node = spec.value("nodeName", "");
  if (node.empty()) {
    std::string scheduler = spec.value("schedulerName", "default-scheduler");
    if (scheduler != "default-scheduler" || node_names_.empty()) return;
    std::string chosen;
    std::string wanted =
        spec.value("nodeSelector", json::object()).value("kubernetes.io/hostname", "");
    if (!wanted.empty()) {
      if (std::find(node_names_.begin(), node_names_.end(), wanted) == node_names_.end()) return;
      chosen = wanted;
    } else {
      chosen = node_names_[next_node_++ % node_names_.size()];
    }
    store_->Mutate("", "pods", ns, name, [&](json& p) {
      if (MetaStr(p, "uid") != uid || !p["spec"].value("nodeName", "").empty()) return false;
      p["spec"]["nodeName"] = chosen;
      return true;
    });
    return;
  }
  if (std::find(node_names_.begin(), node_names_.end(), node) == node_names_.end()) return;
  if (pod.value("status", json::object()).value("phase", "Pending") != "Pending") return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_.insert(uid).second) return;
  }
  if (options_.run_pods) {
    Enqueue(Command{Command::kStart, pod, uid, 0});
  } else {
    MarkRunning(pod, node, "sim://" + uid);
  }
}

void NodeSimulator::MarkRunning(const json& pod, const std::string& node,
                                const std::string& container_id) {
  std::string ip;
  std::string host_ip;
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t index = static_cast<size_t>(std::find(node_names_.begin(), node_names_.end(), node) -
                                       node_names_.begin());
    if (options_.run_pods) {
      ip = host_ip = "127.0.0.1";
    } else {
      int host = ++next_ip_[node] + 1;
      ip = "10.244." + std::to_string(index) + "." + std::to_string(host);
      host_ip = "10.0.0." + std::to_string(index + 1);
    }
  }
  const std::string uid = MetaStr(pod, "uid");
  store_->Mutate("", "pods", MetaStr(pod, "namespace"), MetaStr(pod, "name"), [&](json& p) {
    if (MetaStr(p, "uid") != uid || p["metadata"].contains("deletionTimestamp")) return false;
    json& status = p["status"];
    if (status.value("phase", "Pending") != "Pending") return false;
    std::string now = Now();
    status["phase"] = "Running";
    status["hostIP"] = host_ip;
    status["hostIPs"] = json::array({{{"ip", host_ip}}});
    status["podIP"] = ip;
    status["podIPs"] = json::array({{{"ip", ip}}});
    status["startTime"] = now;
    status["conditions"] = Conditions(true, now);
    json statuses = json::array();
    for (const auto& c : Spec(p).value("containers", json::array())) {
      statuses.push_back({{"name", c.value("name", "")},
                          {"image", c.value("image", "")},
                          {"imageID", ""},
                          {"containerID", container_id},
                          {"ready", true},
                          {"started", true},
                          {"restartCount", 0},
                          {"state", {{"running", {{"startedAt", now}}}}}});
    }
    status["containerStatuses"] = statuses;
    json init = json::array();
    for (const auto& c : Spec(p).value("initContainers", json::array())) {
      init.push_back({{"name", c.value("name", "")},
                      {"image", c.value("image", "")},
                      {"imageID", ""},
                      {"ready", true},
                      {"restartCount", 0},
                      {"state",
                       {{"terminated",
                         {{"exitCode", 0},
                          {"reason", "Completed"},
                          {"startedAt", now},
                          {"finishedAt", now}}}}}});
    }
    if (!init.empty()) status["initContainerStatuses"] = init;
    return true;
  });
}

void NodeSimulator::ProcessLoop() {
  struct Restart {
    std::string ns, name, uid;
    int count;
    Clock::time_point due;
  };
  std::vector<Restart> restarts;
  bool shutdown_signalled = false;
  while (true) {
    std::deque<Command> commands;
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands.swap(commands_);
    }
    for (auto& c : commands) {
      if (c.kind == Command::kStart) {
        if (!stopping_) StartProcess(c.pod, 0);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      auto it = procs_.find(c.uid);
      if (it == procs_.end()) continue;
      Proc& p = *it->second;
      if (c.grace_seconds <= 0) {
        kill(-p.pid, SIGKILL);
        p.kill_sent = true;
      } else if (!p.term_sent) {
        kill(-p.pid, SIGTERM);
        p.term_sent = true;
        p.kill_deadline = Clock::now() + std::chrono::seconds(c.grace_seconds);
      }
    }
    auto now = Clock::now();
    for (auto it = restarts.begin(); it != restarts.end();) {
      if (stopping_) {
        it = restarts.erase(it);
        continue;
      }
      if (it->due > now) {
        ++it;
        continue;
      }
      auto pod_info = store_->registry()->Find("", "v1", "pods");
      try {
        json pod = store_->Get(*pod_info, it->ns, it->name);
        if (MetaStr(pod, "uid") == it->uid && !pod["metadata"].contains("deletionTimestamp")) {
          StartProcess(pod, it->count);
        }
      } catch (const ApiError&) {
        // The pod is gone: nothing to restart.
      }
      it = restarts.erase(it);
    }
    if (stopping_ && !shutdown_signalled) {
      shutdown_signalled = true;
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [uid, p] : procs_) {
        kill(-p->pid, SIGTERM);
        p->term_sent = true;
        p->kill_deadline = std::min(p->kill_deadline, Clock::now() + std::chrono::seconds(2));
      }
    }
    // Reap what exited; escalate what outlived its grace period.
    std::vector<std::pair<std::string, int>> exited;
    std::vector<pollfd> fds;
    fds.push_back({wake_fd_, POLLIN, 0});
    Clock::time_point next_deadline = Clock::now() + std::chrono::milliseconds(100);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [uid, p] : procs_) {
        int status = 0;
        pid_t r = waitpid(p->pid, &status, WNOHANG);
        if (r == p->pid) {
          int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
          exited.push_back({uid, code});
          continue;
        }
        if (!p->kill_sent && Clock::now() >= p->kill_deadline) {
          kill(-p->pid, SIGKILL);
          p->kill_sent = true;
        }
        if (!p->kill_sent) next_deadline = std::min(next_deadline, p->kill_deadline);
        if (p->pidfd >= 0) fds.push_back({p->pidfd, POLLIN, 0});
      }
    }
    for (const auto& [uid, code] : exited) {
      std::string ns, name;
      int count = 0;
      bool restart = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        Proc& p = *procs_[uid];
        ns = p.ns;
        name = p.name;
        count = p.restart_count;
        restart = !p.term_sent && !stopping_ &&
                  (p.restart_policy == "Always" || (p.restart_policy == "OnFailure" && code != 0));
      }
      OnExit(uid, code);
      if (restart)
        restarts.push_back({ns, name, uid, count + 1, Clock::now() + std::chrono::seconds(1)});
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && procs_.empty()) break;
    }
    if (!exited.empty()) continue;
    auto wait_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - Clock::now());
    int timeout = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(100, wait_ms.count())));
    poll(fds.data(), fds.size(), timeout);
    uint64_t drained;
    while (read(wake_fd_, &drained, sizeof(drained)) > 0) {
    }
  }
}

void NodeSimulator::StartProcess(const json& pod, int restart_count) {
  // Only ever called on the process thread, which outlives every child: their
  // PR_SET_PDEATHSIG is tied to it.
  static std::unique_ptr<agent::ProcessSpawner> spawner = agent::MakeVforkSpawner();
  const std::string uid = MetaStr(pod, "uid");
  const std::string ns = MetaStr(pod, "namespace");
  const std::string name = MetaStr(pod, "name");
  const json& spec = Spec(pod);
  const json containers = spec.value("containers", json::array());
  size_t main = MainContainer(pod);
  const json c = containers.empty() ? json::object() : containers[main];
  auto proc = std::make_unique<Proc>();
  proc->uid = uid;
  proc->ns = ns;
  proc->name = name;
  proc->node = spec.value("nodeName", "");
  proc->container = c.value("name", "");
  proc->restart_policy = spec.value("restartPolicy", "Always");
  proc->term_policy = c.value("terminationMessagePolicy", "File");
  proc->restart_count = restart_count;
  proc->dir = work_root_ + "/" + ns + "_" + name + "_" + uid.substr(0, 8);
  std::filesystem::create_directories(proc->dir);
  proc->log_path = proc->dir + "/log";
  proc->term_path = proc->dir + "/termination-log";
  { std::ofstream(proc->term_path, std::ios::trunc); }
  {
    std::lock_guard<std::mutex> lock(mu_);
    log_paths_[ns + "/" + name] = proc->log_path;
  }
  const std::string declared_term = c.value("terminationMessagePath", "/dev/termination-log");
  const std::string pod_ip = "127.0.0.1";

  std::string error;
  // The container environment, in declaration order, for $(VAR) references.
  std::map<std::string, std::string> vars;
  std::vector<std::pair<std::string, std::string>> container_env;
  for (const auto& e : c.value("env", json::array())) {
    std::string key = e.value("name", "");
    std::string value;
    if (e.contains("value")) {
      value = Expand(e.value("value", ""), vars);
    } else if (e.contains("valueFrom")) {
      const json& from = e["valueFrom"];
      if (from.contains("fieldRef")) {
        std::string path = from["fieldRef"].value("fieldPath", "");
        const json& meta = pod["metadata"];
        if (path == "metadata.name")
          value = name;
        else if (path == "metadata.namespace")
          value = ns;
        else if (path == "metadata.uid")
          value = uid;
        else if (path == "spec.nodeName")
          value = proc->node;
        else if (path == "spec.serviceAccountName")
          value = spec.value("serviceAccountName", "default");
        else if (path == "status.podIP" || path == "status.hostIP" || path == "status.podIPs" ||
                 path == "status.hostIPs")
          value = pod_ip;
        else if (path.rfind("metadata.labels['", 0) == 0 ||
                 path.rfind("metadata.annotations['", 0) == 0) {
          bool labels = path.rfind("metadata.labels", 0) == 0;
          size_t q = path.find('\'');
          std::string k = path.substr(q + 1, path.rfind('\'') - q - 1);
          value = meta.value(labels ? "labels" : "annotations", json::object()).value(k, "");
        } else {
          error = "env " + key + ": fieldRef " + path + " is not supported by the test server";
        }
      } else if (from.contains("configMapKeyRef") || from.contains("secretKeyRef")) {
        bool secret = from.contains("secretKeyRef");
        const json& ref = secret ? from["secretKeyRef"] : from["configMapKeyRef"];
        auto info = store_->registry()->Find("", "v1", secret ? "secrets" : "configmaps");
        try {
          json obj = store_->Get(*info, ns, ref.value("name", ""));
          std::string k = ref.value("key", "");
          if (secret && obj.value("data", json::object()).contains(k)) {
            value = Base64DecodeLoose(obj["data"].value(k, ""));
          } else if (secret && obj.value("stringData", json::object()).contains(k)) {
            value = obj["stringData"].value(k, "");
          } else if (!secret && obj.value("data", json::object()).contains(k)) {
            value = obj["data"].value(k, "");
          } else if (!ref.value("optional", false)) {
            error = "env " + key + ": key " + k + " not found in " + ref.value("name", "");
          }
        } catch (const ApiError& ex) {
          if (!ref.value("optional", false)) error = "env " + key + ": " + ex.message();
        }
      }
    }
    value = ReplaceAll(value, declared_term, proc->term_path);
    vars[key] = value;
    container_env.push_back({key, value});
  }
  std::vector<std::string> argv;
  for (const char* field : {"command", "args"}) {
    for (const auto& a : c.value(field, json::array())) {
      argv.push_back(
          ReplaceAll(Expand(a.get<std::string>(), vars), declared_term, proc->term_path));
    }
  }
  if (c.value("command", json::array()).empty() && error.empty()) {
    error = "container " + proc->container +
            " has no command: the test server ignores images, so it needs command (and args)";
  }
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  env["HOSTNAME"] = name;
  env["TERMINATION_MESSAGE_PATH"] = proc->term_path;
  for (const auto& [k, v] : container_env) env[k] = v;

  agent::SpawnOptions so;
  so.argv = argv;
  for (const auto& [k, v] : env) so.env.push_back(k + "=" + v);
  std::string wd = c.value("workingDir", "");
  if (!wd.empty()) so.working_dir = std::filesystem::absolute(wd).string();
  so.new_process_group = true;
  so.death_signal = SIGKILL;
  int log_fd = open(proc->log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  so.stdout_fd = log_fd;
  so.stderr_fd = log_fd;
  if (error.empty()) {
    auto pid = spawner->Spawn(so);
    if (pid.ok()) {
      proc->pid = *pid;
      proc->pidfd = static_cast<int>(syscall(SYS_pidfd_open, proc->pid, 0));
    } else {
      error = pid.status().message();
    }
  }
  if (log_fd >= 0) close(log_fd);
  const std::string now = Now();
  proc->started_at = now;
  if (!error.empty()) {
    // Like a container that cannot start: exit code 128, reason StartError.
    std::ofstream(proc->log_path, std::ios::app) << error << "\n";
    store_->Mutate("", "pods", ns, name, [&](json& p) {
      if (MetaStr(p, "uid") != uid) return false;
      json& status = p["status"];
      status["phase"] = "Failed";
      status["startTime"] = now;
      status["hostIP"] = pod_ip;
      status["podIP"] = pod_ip;
      status["conditions"] = Conditions(false, now);
      status["containerStatuses"] = json::array({{{"name", proc->container},
                                                  {"image", c.value("image", "")},
                                                  {"imageID", ""},
                                                  {"ready", false},
                                                  {"started", false},
                                                  {"restartCount", restart_count},
                                                  {"state",
                                                   {{"terminated",
                                                     {{"exitCode", 128},
                                                      {"reason", "StartError"},
                                                      {"message", error},
                                                      {"startedAt", now},
                                                      {"finishedAt", now}}}}}}});
      return true;
    });
    return;
  }
  const std::string container_id = "local://" + std::to_string(proc->pid);
  {
    std::lock_guard<std::mutex> lock(mu_);
    procs_[uid] = std::move(proc);
  }
  if (restart_count == 0) {
    MarkRunning(pod, spec.value("nodeName", ""), container_id);
  } else {
    store_->Mutate("", "pods", ns, name, [&](json& p) {
      if (MetaStr(p, "uid") != uid) return false;
      for (auto& cs : p["status"]["containerStatuses"]) {
        if (cs.value("name", "") != c.value("name", "")) continue;
        cs["restartCount"] = restart_count;
        cs["containerID"] = container_id;
        cs["ready"] = true;
        cs["started"] = true;
        cs["state"] = {{"running", {{"startedAt", now}}}};
      }
      p["status"]["conditions"] = Conditions(true, now);
      return true;
    });
  }
}

void NodeSimulator::OnExit(const std::string& uid, int code) {
  std::unique_ptr<Proc> p;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = procs_.find(uid);
    if (it == procs_.end()) return;
    p = std::move(it->second);
    procs_.erase(it);
  }
  if (p->pidfd >= 0) close(p->pidfd);
  std::string message = ReadSmallFile(p->term_path, 4096);
  if (message.empty() && p->term_policy == "FallbackToLogsOnError" && code != 0) {
    message = LogTail(p->log_path);
  }
  const std::string now = Now();
  bool restart = !p->term_sent && !stopping_ &&
                 (p->restart_policy == "Always" || (p->restart_policy == "OnFailure" && code != 0));
  json terminated = {{"exitCode", code},
                     {"reason", code == 0 ? "Completed" : "Error"},
                     {"startedAt", p->started_at},
                     {"finishedAt", now},
                     {"containerID", "local://" + std::to_string(p->pid)}};
  if (code > 128) terminated["signal"] = code - 128;
  if (!message.empty()) terminated["message"] = message;
  bool deleting = false;
  store_->Mutate("", "pods", p->ns, p->name, [&](json& pod) {
    if (MetaStr(pod, "uid") != uid) return false;
    deleting = pod["metadata"].contains("deletionTimestamp");
    json& status = pod["status"];
    for (auto& cs : status["containerStatuses"]) {
      bool main = cs.value("name", "") == p->container;
      cs["ready"] = false;
      cs["started"] = false;
      if (main && restart) {
        cs["lastState"] = {{"terminated", terminated}};
        cs["state"] = {{"waiting",
                        {{"reason", "CrashLoopBackOff"},
                         {"message", "back-off 1s restarting failed container"}}}};
      } else if (main) {
        cs["state"] = {{"terminated", terminated}};
      } else {
        cs["state"] = {{"terminated",
                        {{"exitCode", 0},
                         {"reason", "Completed"},
                         {"startedAt", p->started_at},
                         {"finishedAt", now}}}};
      }
    }
    if (!restart) status["phase"] = code == 0 ? "Succeeded" : "Failed";
    status["conditions"] = Conditions(false, now);
    return true;
  });
  if (deleting || p->term_sent) store_->FinishPodTermination(p->ns, p->name, uid);
}

}  // namespace spawnpoint::kubetest
