// kube-test-server: a Kubernetes API server for tests (see api_server.h and the README in
// this folder). Prints `listening on http://127.0.0.1:PORT` as its first stdout line once
// it serves, after writing the kubeconfig; exits 0 on SIGTERM/SIGINT, 2 on bad flags.
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "tests/apiserver/api_server.h"

namespace {

const char* kUsage =
    "usage: kube-test-server [--port N] [--kubeconfig-out FILE] [--simulate-nodes N]\n"
    "                        [--run-pods] [--pod-work-dir DIR] [--watch-window N]\n"
    "                        [--bookmark-interval-ms N] [--faults SPEC|@FILE]\n"
    "                        [--legacy-discovery] [--authorization always-allow|rbac]\n"
    "                        [--no-token admin|anonymous|reject] [--verbose]\n";

[[noreturn]] void Fail(int code, const std::string& message) {
  std::cerr << "kube-test-server: " << message << std::endl;
  std::exit(code);
}

long ParseNumber(const std::string& flag, const std::string& value, long min) {
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < min) {
    Fail(2, flag + ": \"" + value + "\" is not a number >= " + std::to_string(min));
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using spawnpoint::kubetest::ApiServer;
  using spawnpoint::kubetest::ServerOptions;
  ServerOptions options;
  std::string kubeconfig_out;
  std::string faults;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Fail(2, flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--port") {
      options.port = static_cast<int>(ParseNumber(flag, value(), 0));
    } else if (flag == "--kubeconfig-out") {
      kubeconfig_out = value();
    } else if (flag == "--simulate-nodes") {
      options.simulate_nodes = static_cast<int>(ParseNumber(flag, value(), 0));
    } else if (flag == "--run-pods") {
      options.run_pods = true;
    } else if (flag == "--pod-work-dir") {
      options.pod_work_root = value();
    } else if (flag == "--watch-window") {
      options.watch_window = static_cast<size_t>(ParseNumber(flag, value(), 1));
    } else if (flag == "--bookmark-interval-ms") {
      options.bookmark_interval = std::chrono::milliseconds(ParseNumber(flag, value(), 1));
    } else if (flag == "--faults") {
      faults = value();
    } else if (flag == "--authorization") {
      std::string mode = value();
      if (mode == "always-allow" || mode == "AlwaysAllow") {
        options.authorization = spawnpoint::kubetest::AuthorizationMode::kAlwaysAllow;
      } else if (mode == "rbac" || mode == "RBAC") {
        options.authorization = spawnpoint::kubetest::AuthorizationMode::kRbac;
      } else {
        Fail(2, flag + ": \"" + mode + "\" is not one of always-allow, rbac");
      }
    } else if (flag == "--no-token") {
      std::string mode = value();
      if (mode == "admin") {
        options.no_token = spawnpoint::kubetest::NoTokenMode::kAdmin;
      } else if (mode == "anonymous") {
        options.no_token = spawnpoint::kubetest::NoTokenMode::kAnonymous;
      } else if (mode == "reject") {
        options.no_token = spawnpoint::kubetest::NoTokenMode::kReject;
      } else {
        Fail(2, flag + ": \"" + mode + "\" is not one of admin, anonymous, reject");
      }
    } else if (flag == "--legacy-discovery") {
      options.aggregated_discovery = false;
    } else if (flag == "--verbose" || flag == "-v") {
      options.verbose = true;
    } else if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      return 0;
    } else {
      Fail(2, "unknown flag " + flag + "\n" + kUsage);
    }
  }
  if (options.run_pods && options.simulate_nodes == 0) options.simulate_nodes = 1;
  if (!faults.empty() && faults[0] == '@') {
    std::ifstream in(faults.substr(1));
    if (!in) Fail(2, "--faults: cannot read " + faults.substr(1));
    std::stringstream ss;
    ss << in.rdbuf();
    faults = ss.str();
  }

  // Every thread inherits this mask, so only sigwait() below sees the stop signals.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ApiServer server(options);
  if (!faults.empty()) {
    auto st = server.faults().Add(faults);
    if (!st.ok()) Fail(2, "--faults: " + st.message());
  }
  auto port = server.Start();
  if (!port.ok()) Fail(1, port.status().message());
  if (!kubeconfig_out.empty()) {
    std::ofstream out(kubeconfig_out, std::ios::trunc);
    out << spawnpoint::kubetest::KubeconfigFor(*port);
    if (!out.flush()) Fail(1, "cannot write kubeconfig " + kubeconfig_out);
  }
  std::cout << "listening on http://127.0.0.1:" << *port << std::endl;

  int sig = 0;
  sigwait(&stop_signals, &sig);
  if (options.verbose) std::cerr << "level=info msg=\"stopping\" signal=" << sig << std::endl;
  server.Stop();
  return 0;
}
