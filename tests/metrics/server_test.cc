// The metrics HTTP server over real sockets: endpoints, content type, probes, extra
// handlers, bad requests, limits, and stopping with clients still connected.
#include "metrics/server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/metrics/http_client.h"
#include "tests/metrics/sample_parser.h"
#include "tests/support/test_process.h"

namespace spawnpoint::metrics {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using testing::HttpGet;
using testing::HttpRaw;

// A client socket connected to the server that sends nothing (a stuck scraper).
int ConnectIdle(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto* c =
        registry_.AddCounter({.name = "x_requests_total", .help = "h", .labels = {"code"}}).value();
    c->WithLabels({"200"})->Inc(3);
  }
  std::unique_ptr<MetricsServer> Start(ServerOptions o = {}) {
    o.address = "127.0.0.1:0";
    if (o.registry == nullptr) o.registry = &registry_;
    auto s = MetricsServer::Start(o);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return std::move(s).value();
  }
  Registry registry_;
};

TEST_F(MetricsServerTest, ServesMetricsInTheTextFormat) {
  auto server = Start();
  ASSERT_GT(server->port(), 0);
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));
  auto r = HttpGet("127.0.0.1", server->port(), "/metrics");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r->body, registry_.Render());
  EXPECT_EQ(r->headers["content-length"], std::to_string(r->body.size()));
  EXPECT_EQ(testing::ParseSamples(r->body).at("x_requests_total{code=\"200\"}"), 3);

  auto head = HttpGet("127.0.0.1", server->port(), "/metrics", "HEAD");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->body, "");
  EXPECT_EQ(head->headers["content-length"], std::to_string(r->body.size()));
}

TEST_F(MetricsServerTest, HealthAndReadiness) {
  auto server = Start();
  EXPECT_EQ(HttpGet("127.0.0.1", server->port(), "/healthz")->status, 200);
  auto not_ready = HttpGet("127.0.0.1", server->port(), "/readyz");
  EXPECT_EQ(not_ready->status, 503);
  EXPECT_THAT(not_ready->body, HasSubstr("not ready"));
  server->SetReady(true);
  EXPECT_EQ(HttpGet("127.0.0.1", server->port(), "/readyz")->status, 200);
  server->SetReady(false, "ranks restarting");
  auto draining = HttpGet("127.0.0.1", server->port(), "/readyz");
  EXPECT_EQ(draining->status, 503);
  EXPECT_EQ(draining->body, "not ready: ranks restarting\n");
}

TEST_F(MetricsServerTest, ExtraHandlersSeeThePathAndQuery) {
  auto server = Start();
  std::string seen_query;
  server->Handle("/status", [&](const HttpRequest& req) {
    seen_query = req.query;
    return HttpResponse{.status = 200, .content_type = "application/json", .body = "{\"a\":1}"};
  });
  auto r = HttpGet("127.0.0.1", server->port(), "/status?verbose=1");
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["content-type"], "application/json");
  EXPECT_EQ(r->body, "{\"a\":1}");
  EXPECT_EQ(seen_query, "verbose=1");
  server->Handle("/boom", [](const HttpRequest&) -> HttpResponse {
    throw std::runtime_error("handler failed");
  });
  auto boom = HttpGet("127.0.0.1", server->port(), "/boom");
  EXPECT_EQ(boom->status, 500);
  EXPECT_THAT(boom->body, HasSubstr("handler failed"));
  auto index = HttpGet("127.0.0.1", server->port(), "/");
  EXPECT_THAT(index->body, HasSubstr("/status"));
  EXPECT_THAT(index->body, HasSubstr("/metrics"));
}

TEST_F(MetricsServerTest, BadRequestsGetTheirStatus) {
  auto server = Start();
  const int port = server->port();
  EXPECT_EQ(HttpGet("127.0.0.1", port, "/nope")->status, 404);
  auto post = HttpGet("127.0.0.1", port, "/metrics", "POST");
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->headers["allow"], "GET, HEAD");
  EXPECT_EQ(HttpRaw("127.0.0.1", port, "garbage\r\n\r\n")->status, 400);
  std::string huge = "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(20'000, 'a') + "\r\n\r\n";
  EXPECT_EQ(HttpRaw("127.0.0.1", port, huge)->status, 431);
  // HTTP/1.0 and bare-LF clients are served too.
  EXPECT_EQ(HttpRaw("127.0.0.1", port, "GET /healthz HTTP/1.0\n\n")->status, 200);
}

TEST_F(MetricsServerTest, AddressesAndBindErrors) {
  auto p = ParseListenAddress(":9400");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->first, "");
  EXPECT_EQ(p->second, 9400);
  EXPECT_EQ(ParseListenAddress("9400")->second, 9400);
  EXPECT_EQ(ParseListenAddress("10.0.0.1:0")->first, "10.0.0.1");
  EXPECT_EQ(ParseListenAddress("[::1]:80")->first, "::1");
  for (const char* bad : {"", "host:", "host:port", ":70000", "::1:80", "[::1]80", ":-1"}) {
    EXPECT_EQ(ParseListenAddress(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }

  auto first = Start();
  auto second = MetricsServer::Start(
      {.address = "127.0.0.1:" + std::to_string(first->port()), .registry = &registry_});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("Address already in use"));
  auto unresolvable = MetricsServer::Start({.address = "no-such-host.invalid:0"});
  EXPECT_FALSE(unresolvable.ok());
}

TEST_F(MetricsServerTest, EveryInterfaceIsReachableOnLoopback) {
  auto s = MetricsServer::Start({.address = ":0", .registry = &registry_});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(HttpGet("127.0.0.1", (*s)->port(), "/metrics")->status, 200);
}

TEST_F(MetricsServerTest, ASilentClientIsCutAndDoesNotBlockOthers) {
  auto server = Start({.io_timeout = milliseconds(300)});
  int idle = ConnectIdle(server->port());
  // Served meanwhile on another thread.
  EXPECT_EQ(HttpGet("127.0.0.1", server->port(), "/healthz")->status, 200);
  // The silent one is closed without an answer once the timeout passes (recv sees EOF
  // rather than waiting out its own 10 s timeout).
  timeval tv{10, 0};
  setsockopt(idle, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(recv(idle, buf, sizeof(buf), 0), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5'000));
  close(idle);
  // A request cut off part-way is answered 408.
  auto partial = HttpRaw("127.0.0.1", server->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n");
  ASSERT_TRUE(partial.ok()) << partial.status().message();
  EXPECT_EQ(partial->status, 408);
}

TEST_F(MetricsServerTest, ConnectionsOverTheLimitGet503) {
  auto server = Start({.max_connections = 2, .io_timeout = milliseconds(20'000)});
  int a = ConnectIdle(server->port());
  int b = ConnectIdle(server->port());
  auto over = HttpGet("127.0.0.1", server->port(), "/healthz");
  ASSERT_TRUE(over.ok()) << over.status().message();
  EXPECT_EQ(over->status, 503);
  EXPECT_THAT(over->body, HasSubstr("too many connections"));
  close(a);
  close(b);
  // Their threads end when they see the close; then there is room again.
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        auto r = HttpGet("127.0.0.1", server->port(), "/healthz");
        return r.ok() && r->status == 200;
      },
      milliseconds(10'000)));
}

TEST_F(MetricsServerTest, StopCutsOpenConnectionsPromptly) {
  auto server = Start({.io_timeout = milliseconds(60'000)});
  int idle = ConnectIdle(server->port());
  const int port = server->port();
  // Make sure the server took the connection before stopping.
  EXPECT_EQ(HttpGet("127.0.0.1", port, "/healthz")->status, 200);
  auto start = std::chrono::steady_clock::now();
  server->Stop();
  server->Stop();  // idempotent
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5'000));
  close(idle);
  EXPECT_FALSE(HttpGet("127.0.0.1", port, "/healthz").ok());
}

TEST_F(MetricsServerTest, ConcurrentScrapesAllSucceed) {
  auto server = Start();
  auto* g = registry_.AddGauge({.name = "x_value", .help = "h"}).value();
  std::atomic<int> ok{0}, bad{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop; ++i) g->WithLabels({})->Set(i);
  });
  std::vector<std::thread> scrapers;
  for (int t = 0; t < 6; ++t) {
    scrapers.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        auto r = HttpGet("127.0.0.1", server->port(), "/metrics");
        if (r.ok() && r->status == 200 && r->body.find("x_value ") != std::string::npos) {
          ++ok;
        } else {
          ++bad;
        }
      }
    });
  }
  for (auto& t : scrapers) t.join();
  stop = true;
  writer.join();
  EXPECT_EQ(ok, 150);
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace spawnpoint::metrics
