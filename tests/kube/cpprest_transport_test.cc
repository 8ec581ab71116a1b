// The production transport over real sockets: an in-process cpprest listener plays the
// API server (plain HTTP, and HTTPS requiring a client certificate from a throwaway CA).
#include "operator/kube/cpprest_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
// cpprest's U() macro collides with gtest templates.
#define _TURN_OFF_PLATFORM_STRING
#include <arpa/inet.h>
#include <cpprest/http_listener.h>
#include <cpprest/producerconsumerstream.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ssl.hpp>
#include <future>
#include <thread>

#include "tests/support/free_port.h"
#include "tests/support/test_process.h"

namespace spawnpoint::kube {
namespace {

using spawnpoint::testing::ReadFile;
using spawnpoint::testing::TempDir;
using spawnpoint::testing::TestProcess;
using spawnpoint::testing::WriteFile;
using ::testing::HasSubstr;
using ::testing::Not;
namespace http = web::http;
namespace listener = web::http::experimental::listener;

using spawnpoint::testing::FreePort;
// A listener whose handler the test sets; streams are fed through `stream_buf`.
class TestServer {
 public:
  explicit TestServer(const std::string& scheme,
                      std::function<void(boost::asio::ssl::context&)> tls = nullptr)
      : url_(scheme + "://127.0.0.1:" + std::to_string(FreePort())) {
    listener::http_listener_config cfg;
    if (tls) cfg.set_ssl_context_callback(tls);
    l_ = std::make_unique<listener::http_listener>(url_, cfg);
    l_->support([this](http::http_request req) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        last_auth_ = req.headers().has("Authorization") ? req.headers()["Authorization"] : "";
        last_path_ = req.relative_uri().to_string();
        last_body_ = req.extract_string().get();
      }
      if (req.relative_uri().path() == "/stream") {
        req.reply(http::status_codes::OK, stream_buf.create_istream(), "application/json");
      } else if (req.relative_uri().path() == "/missing") {
        req.reply(http::status_codes::NotFound,
                  R"({"kind":"Status","code":404,"reason":"NotFound","message":"no"})",
                  "application/json");
      } else {
        req.reply(http::status_codes::OK, R"({"kind":"Pod"})", "application/json");
      }
    });
    l_->open().wait();
  }
  ~TestServer() { l_->close().wait(); }
  const std::string& url() const { return url_; }
  void Write(const std::string& s) {
    stream_buf.putn_nocopy(reinterpret_cast<const uint8_t*>(s.data()), s.size()).wait();
    stream_buf.sync().wait();
  }
  std::string LastAuth() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_auth_;
  }
  std::string LastPath() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_path_;
  }
  std::string LastBody() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_body_;
  }

  concurrency::streams::producer_consumer_buffer<uint8_t> stream_buf;

 private:
  std::string url_;
  std::unique_ptr<listener::http_listener> l_;
  std::mutex mu_;
  std::string last_auth_, last_path_, last_body_;
};

HttpRequest Get(const std::string& target,
                std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  HttpRequest r;
  r.method = "GET";
  r.target = target;
  r.timeout = timeout;
  r.headers["authorization"] = "Bearer tok";
  return r;
}

TEST(CpprestTransportTest, ExchangesRequestsAndErrors) {
  TestServer server("http");
  RestConfig c;
  c.server = server.url();
  auto t = NewCpprestTransport(c);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  HttpResponse r = (*t)->Send(Get("/api/v1/namespaces/ml/pods/p?labelSelector=a%3Db"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, R"({"kind":"Pod"})");
  EXPECT_EQ(r.Header("content-type"), "application/json");
  EXPECT_EQ(server.LastAuth(), "Bearer tok");
  EXPECT_EQ(server.LastPath(), "/api/v1/namespaces/ml/pods/p?labelSelector=a%3Db");

  HttpRequest post = Get("/api/v1/namespaces/ml/pods");
  post.method = "POST";
  post.body = R"({"metadata":{"name":"x"}})";
  post.headers["content-type"] = "application/json";
  EXPECT_EQ((*t)->Send(post).status, 200);
  EXPECT_EQ(server.LastBody(), post.body);

  r = (*t)->Send(Get("/missing"));
  EXPECT_EQ(r.status, 404);
  EXPECT_THAT(r.body, HasSubstr("NotFound"));
}

TEST(CpprestTransportTest, ConnectionRefusedIsMarkedNotSent) {
  RestConfig c;
  c.server = "http://127.0.0.1:" + std::to_string(FreePort());
  auto t = NewCpprestTransport(c);
  ASSERT_TRUE(t.ok());
  HttpResponse r = (*t)->Send(Get("/api/v1/pods"));
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.error.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(r.request_sent);
}

TEST(CpprestTransportTest, StreamsLinesAsTheyArriveAndCancels) {
  TestServer server("http");
  RestConfig c;
  c.server = server.url();
  auto t = NewCpprestTransport(c);
  ASSERT_TRUE(t.ok());
  std::unique_ptr<HttpStream> s;
  server.Write("{\"a\":1}\n{\"b\"");  // one line and a half
  HttpResponse r = (*t)->OpenStream(Get("/stream"), &s);
  ASSERT_EQ(r.status, 200);
  ASSERT_TRUE(s);
  auto l = s->ReadLine();
  ASSERT_TRUE(l.ok() && l->has_value()) << l.status().ToString();
  EXPECT_EQ(**l, R"({"a":1})");
  // The rest of the line arrives later, split across chunks.
  auto next = std::async(std::launch::async, [&] { return s->ReadLine(); });
  server.Write(":2}\n");
  auto l2 = next.get();
  ASSERT_TRUE(l2.ok() && l2->has_value());
  EXPECT_EQ(**l2, R"({"b":2})");
  // A reader blocked on a quiet stream is released by Cancel from another thread.
  auto blocked = std::async(std::launch::async, [&] { return s->ReadLine(); });
  EXPECT_EQ(blocked.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  s->Cancel();
  auto l3 = blocked.get();
  EXPECT_EQ(l3.status().code(), StatusCode::kUnavailable);
  server.stream_buf.close(std::ios_base::out).wait();
}

TEST(CpprestTransportTest, StalledStreamTimesOut) {
  TestServer server("http");
  RestConfig c;
  c.server = server.url();
  auto t = NewCpprestTransport(c);
  ASSERT_TRUE(t.ok());
  std::unique_ptr<HttpStream> s;
  server.Write("{}\n");
  HttpResponse r = (*t)->OpenStream(Get("/stream", std::chrono::milliseconds(1000)), &s);
  ASSERT_EQ(r.status, 200);
  auto l = s->ReadLine();
  ASSERT_TRUE(l.ok() && l->has_value());
  l = s->ReadLine();  // nothing more: the idle timeout fires
  EXPECT_EQ(l.status().code(), StatusCode::kDeadlineExceeded) << l.status().ToString();
  server.stream_buf.close(std::ios_base::out).wait();
}

TEST(CpprestTransportTest, CleanEndOfStream) {
  TestServer server("http");
  RestConfig c;
  c.server = server.url();
  auto t = NewCpprestTransport(c);
  std::unique_ptr<HttpStream> s;
  server.Write("{}\n");
  server.stream_buf.close(std::ios_base::out).wait();
  ASSERT_EQ((*t)->OpenStream(Get("/stream"), &s).status, 200);
  EXPECT_TRUE(s->ReadLine()->has_value());
  auto end = s->ReadLine();
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_FALSE(end->has_value());
}

// A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl.
class Pki {
 public:
  Pki() {
    Run({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", F("ca.key"), "-out", F("ca.crt"), "-days", "1", "-subj", "/CN=test-ca"});
    Run({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", F("other-ca.key"), "-out", F("other-ca.crt"), "-days", "1", "-subj",
         "/CN=other-ca"});
    Issue("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1");
    Issue("client", "/CN=spawnpoint-operator", "extendedKeyUsage=clientAuth");
  }
  std::string F(const std::string& n) const { return dir_.File(n); }
  std::string Pem(const std::string& n) const { return ReadFile(F(n)); }

 private:
  void Issue(const std::string& name, const std::string& subject, const std::string& ext) {
    WriteFile(F(name + ".ext"), ext + "\n");
    Run({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
         F(name + ".key"), "-out", F(name + ".csr"), "-subj", subject});
    Run({"x509", "-req", "-in", F(name + ".csr"), "-CA", F("ca.crt"), "-CAkey", F("ca.key"),
         "-CAcreateserial", "-out", F(name + ".crt"), "-days", "1", "-extfile", F(name + ".ext")});
  }
  void Run(std::vector<std::string> args) {
    args.insert(args.begin(), OPENSSL_BIN);
    TestProcess p(args);
    int code = p.Wait(std::chrono::seconds(30));
    ASSERT_EQ(code, 0) << p.Stderr();
  }
  TempDir dir_;
};

TEST(CpprestTransportTest, MutualTlsWithConfiguredCaAndClientCertificate) {
  Pki pki;
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  TestServer server("https", [&](boost::asio::ssl::context& ctx) {
    ctx.set_options(boost::asio::ssl::context::default_workarounds);
    ctx.use_certificate_chain_file(pki.F("server.crt"));
    ctx.use_private_key_file(pki.F("server.key"), boost::asio::ssl::context::pem);
    ctx.load_verify_file(pki.F("ca.crt"));
    ctx.set_verify_mode(boost::asio::ssl::verify_peer |
                        boost::asio::ssl::verify_fail_if_no_peer_cert);
  });
  RestConfig c;
  c.server = server.url();
  c.certificate_authority_pem = pki.Pem("ca.crt");
  c.client_certificate_pem = pki.Pem("client.crt");
  c.client_key_pem = pki.Pem("client.key");
  auto t = NewCpprestTransport(c);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  HttpResponse r = (*t)->Send(Get("/api/v1/pods"));
  EXPECT_EQ(r.status, 200) << r.error.ToString();

  // Streams go over TLS too.
  std::unique_ptr<HttpStream> s;
  server.Write("{\"tls\":true}\n");
  ASSERT_EQ((*t)->OpenStream(Get("/stream"), &s).status, 200);
  auto l = s->ReadLine();
  ASSERT_TRUE(l.ok() && l->has_value()) << l.status().ToString();
  EXPECT_EQ(**l, R"({"tls":true})");
  s->Cancel();

  // The server's certificate is not signed by the CA we trust: refused before sending.
  RestConfig wrong_ca = c;
  wrong_ca.certificate_authority_pem = pki.Pem("other-ca.crt");
  r = (*NewCpprestTransport(wrong_ca))->Send(Get("/api/v1/pods"));
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(r.request_sent) << r.error.ToString();

  // ... unless verification is switched off.
  RestConfig insecure = wrong_ca;
  insecure.insecure_skip_tls_verify = true;
  EXPECT_EQ((*NewCpprestTransport(insecure))->Send(Get("/api/v1/pods")).status, 200);

  // No client certificate: the server refuses the handshake.
  RestConfig anonymous = c;
  anonymous.client_certificate_pem.clear();
  anonymous.client_key_pem.clear();
  r = (*NewCpprestTransport(anonymous))->Send(Get("/api/v1/pods"));
  EXPECT_EQ(r.status, 0);
  server.stream_buf.close(std::ios_base::out).wait();
}

TEST(CpprestTransportTest, BadTlsMaterialFailsEarlyWithoutEchoingIt) {
  RestConfig c;
  c.server = "https://127.0.0.1:1";
  c.client_certificate_pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  c.client_key_pem = "-----BEGIN PRIVATE KEY-----\nSECRETKEYBYTES\n-----END PRIVATE KEY-----\n";
  auto t = NewCpprestTransport(c);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("client-certificate"));
  EXPECT_THAT(t.status().message(), Not(HasSubstr("SECRETKEYBYTES")));
  c.client_certificate_pem.clear();
  t = NewCpprestTransport(c);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("client-key"));
  EXPECT_THAT(t.status().message(), Not(HasSubstr("SECRETKEYBYTES")));
}

}  // namespace
}  // namespace spawnpoint::kube
