#include "operator/kube/cpprest_transport.h"

// cpprest's U() macro would leak into everything included after it.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/http_client.h>

#include <atomic>
#include <boost/asio/ssl.hpp>
#include <cerrno>
#include <map>
#include <mutex>
#include <system_error>

namespace spawnpoint::kube {
namespace {

namespace http = web::http;
namespace client = web::http::client;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Classifies a failed exchange. Only failures that happen before anything was written to
// the socket (refused, unresolvable, TLS handshake) are marked as not sent.
HttpResponse Failure(const std::exception& e, bool timed_out_hint = false) {
  HttpResponse r;
  std::string what = e.what();
  int code = 0;
  if (auto* he = dynamic_cast<const http::http_exception*>(&e)) code = he->error_code().value();
  std::string lower = Lower(what);
  bool timeout = timed_out_hint || code == ETIMEDOUT ||
                 lower.find("timed out") != std::string::npos ||
                 lower.find("timeout") != std::string::npos;
  bool not_sent = code == ECONNREFUSED || lower.find("refused") != std::string::npos ||
                  lower.find("resolv") != std::string::npos ||
                  lower.find("handshake") != std::string::npos ||
                  lower.find("failed to connect") != std::string::npos;
  if (timeout && !not_sent) {
    r.error = Status(StatusCode::kDeadlineExceeded, "request timed out: " + what);
  } else {
    r.error = Unavailable((not_sent ? "cannot connect: " : "connection failed: ") + what);
  }
  r.request_sent = !not_sent;
  return r;
}

Headers CopyHeaders(const http::http_headers& in) {
  Headers out;
  for (const auto& [k, v] : in) out[Lower(k)] = v;
  return out;
}

http::http_request MakeRequest(const HttpRequest& in) {
  http::http_request req(in.method);
  req.set_request_uri(web::uri(in.target));
  std::string content_type;
  for (const auto& [k, v] : in.headers) {
    if (k == "content-type") {
      content_type = v;
      continue;
    }
    req.headers().add(k, v);
  }
  if (!in.body.empty() || in.method == "POST" || in.method == "PUT" || in.method == "PATCH") {
    req.set_body(in.body, content_type.empty() ? "application/json" : content_type);
  }
  return req;
}

std::string ReadBody(http::http_response& resp) {
  auto bytes = resp.extract_vector().get();
  return std::string(bytes.begin(), bytes.end());
}

class CpprestStream : public HttpStream {
 public:
  CpprestStream(http::http_response response, std::shared_ptr<client::http_client> client,
                std::shared_ptr<pplx::cancellation_token_source> cancel)
      : response_(std::move(response)),
        client_(std::move(client)),
        cancel_(std::move(cancel)),
        buf_(response_.body().streambuf()) {}

  ~CpprestStream() override { Cancel(); }

  StatusOr<std::optional<std::string>> ReadLine() override {
    if (failed_) return Unavailable("watch stream already failed");
    for (;;) {
      auto nl = pending_.find('\n', scanned_);
      if (nl != std::string::npos) {
        std::string line = pending_.substr(0, nl);
        pending_.erase(0, nl + 1);
        scanned_ = 0;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return std::optional<std::string>(std::move(line));
      }
      scanned_ = pending_.size();
      try {
        // Block for one byte, then take whatever else has already arrived.
        auto c = buf_.bumpc().get();
        if (c == concurrency::streams::streambuf<uint8_t>::traits::eof()) {
          failed_ = true;
          if (cancelled_.load()) return Unavailable("watch cancelled");
          if (!pending_.empty()) {
            return Unavailable("stream ended in the middle of a line (" +
                               std::to_string(pending_.size()) + " bytes)");
          }
          return std::optional<std::string>();
        }
        pending_.push_back(static_cast<char>(c));
        size_t avail = buf_.in_avail();
        if (avail > 0) {
          size_t old = pending_.size();
          pending_.resize(old + avail);
          size_t got = buf_.getn(reinterpret_cast<uint8_t*>(pending_.data() + old), avail).get();
          pending_.resize(old + got);
        }
      } catch (const std::exception& e) {
        failed_ = true;
        if (cancelled_.load()) return Unavailable("watch cancelled");
        return Failure(e).error;
      }
    }
  }

  void Cancel() override {
    if (cancelled_.exchange(true)) return;
    cancel_->cancel();
    // Closing our end unblocks a reader even if the connection is not torn down at once.
    try {
      buf_.close(std::ios_base::in).wait();
    } catch (...) {
    }
  }

 private:
  http::http_response response_;
  std::shared_ptr<client::http_client> client_;  // keeps the connection's owner alive
  std::shared_ptr<pplx::cancellation_token_source> cancel_;
  concurrency::streams::streambuf<uint8_t> buf_;
  std::string pending_;
  size_t scanned_ = 0;
  bool failed_ = false;
  std::atomic<bool> cancelled_{false};
};

class CpprestTransport : public HttpTransport {
 public:
  explicit CpprestTransport(RestConfig config) : config_(std::move(config)) {}

  HttpResponse Send(const HttpRequest& request) override {
    auto cl = ClientFor(request.timeout);
    try {
      http::http_response resp = cl->request(MakeRequest(request)).get();
      HttpResponse out;
      out.status = resp.status_code();
      out.headers = CopyHeaders(resp.headers());
      out.body = ReadBody(resp);
      return out;
    } catch (const std::exception& e) {
      return Failure(e);
    }
  }

  HttpResponse OpenStream(const HttpRequest& request,
                          std::unique_ptr<HttpStream>* stream) override {
    // Its own http_client: the idle timeout is per client, and a watch holds a connection.
    auto cl = NewClient(request.timeout);
    auto cancel = std::make_shared<pplx::cancellation_token_source>();
    try {
      http::http_response resp = cl->request(MakeRequest(request), cancel->get_token()).get();
      HttpResponse out;
      out.status = resp.status_code();
      out.headers = CopyHeaders(resp.headers());
      if (out.status >= 200 && out.status < 300) {
        *stream = std::make_unique<CpprestStream>(std::move(resp), cl, cancel);
      } else {
        out.body = ReadBody(resp);
      }
      return out;
    } catch (const std::exception& e) {
      return Failure(e);
    }
  }

  Status Validate() {
    try {
      boost::asio::ssl::context ctx(boost::asio::ssl::context::tls_client);
      Status st = ConfigureTls(ctx);
      if (!st.ok()) return st;
      auto uri = web::uri(config_.server);
      if (uri.host().empty()) return InvalidArgument("server URL has no host: " + config_.server);
    } catch (const std::exception& e) {
      return InvalidArgument("bad server URL " + config_.server);
    }
    return Status::Ok();
  }

 private:
  // Loads the TLS material into `ctx`. Errors name the field, never its content.
  Status ConfigureTls(boost::asio::ssl::context& ctx) const {
    auto load = [&](const std::string& pem, const char* what, auto fn) -> Status {
      if (pem.empty()) return Status::Ok();
      boost::system::error_code ec;
      fn(boost::asio::buffer(pem.data(), pem.size()), ec);
      if (ec)
        return InvalidArgument(std::string(what) + " is not valid PEM (" + ec.message() + ")");
      return Status::Ok();
    };
    SP_RETURN_IF_ERROR(load(config_.certificate_authority_pem, "certificate-authority",
                            [&](auto b, auto& ec) { ctx.add_certificate_authority(b, ec); }));
    SP_RETURN_IF_ERROR(load(config_.client_certificate_pem, "client-certificate",
                            [&](auto b, auto& ec) { ctx.use_certificate_chain(b, ec); }));
    SP_RETURN_IF_ERROR(load(config_.client_key_pem, "client-key", [&](auto b, auto& ec) {
      ctx.use_private_key(b, boost::asio::ssl::context::pem, ec);
    }));
    return Status::Ok();
  }

  std::shared_ptr<client::http_client> NewClient(std::chrono::milliseconds timeout) {
    client::http_client_config cfg;
    cfg.set_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    cfg.set_validate_certificates(!config_.insecure_skip_tls_verify);
    if (config_.server.rfind("https://", 0) == 0) {
      cfg.set_ssl_context_callback([this](boost::asio::ssl::context& ctx) {
        // Validated in Validate(); a failure here would only repeat that error.
        (void)ConfigureTls(ctx);
      });
    }
    return std::make_shared<client::http_client>(web::uri(config_.server), cfg);
  }

  // Clients are cached per timeout (rounded up to whole seconds, so a handful exist).
  std::shared_ptr<client::http_client> ClientFor(std::chrono::milliseconds timeout) {
    auto secs = std::chrono::ceil<std::chrono::seconds>(timeout);
    if (secs.count() < 1) secs = std::chrono::seconds(1);
    std::lock_guard<std::mutex> lock(mu_);
    auto& cl = clients_[secs.count()];
    if (!cl) cl = NewClient(secs);
    return cl;
  }

  const RestConfig config_;
  std::mutex mu_;
  std::map<int64_t, std::shared_ptr<client::http_client>> clients_;
};

}  // namespace

StatusOr<std::unique_ptr<HttpTransport>> NewCpprestTransport(const RestConfig& config) {
  if (!config.tls_server_name.empty()) {
    return InvalidArgument(
        "tls-server-name is not supported by the cpprest transport; point the server URL at a "
        "name the certificate covers");
  }
  auto t = std::make_unique<CpprestTransport>(config);
  SP_RETURN_IF_ERROR(t->Validate());
  return std::unique_ptr<HttpTransport>(std::move(t));
}

}  // namespace spawnpoint::kube
