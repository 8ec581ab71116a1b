#include "tests/kube/fake_transport.h"

#include <nlohmann/json.hpp>

namespace spawnpoint::kube::testing {

void FakeStreamControl::PushLine(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  lines_.push_back(line);
  cv_.notify_all();
}

void FakeStreamControl::End() {
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = true;
  cv_.notify_all();
}

void FakeStreamControl::Fail(Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  failure_ = std::move(status);
  cv_.notify_all();
}

bool FakeStreamControl::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

StatusOr<std::optional<std::string>> FakeStreamControl::Read() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !lines_.empty() || ended_ || !failure_.ok() || cancelled_; });
  if (cancelled_) return Unavailable("cancelled");
  if (!lines_.empty()) {
    std::string l = std::move(lines_.front());
    lines_.pop_front();
    return std::optional<std::string>(std::move(l));
  }
  if (!failure_.ok()) return failure_;
  return std::optional<std::string>();
}

void FakeStreamControl::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  cv_.notify_all();
}

namespace {
class FakeStream : public HttpStream {
 public:
  explicit FakeStream(std::shared_ptr<FakeStreamControl> c) : c_(std::move(c)) {}
  // Like closing a real connection: the server side sees the watcher go away.
  ~FakeStream() override { c_->Cancel(); }
  StatusOr<std::optional<std::string>> ReadLine() override { return c_->Read(); }
  void Cancel() override { c_->Cancel(); }

 private:
  std::shared_ptr<FakeStreamControl> c_;
};
}  // namespace

void FakeTransport::SetSendHandler(SendHandler h) {
  std::lock_guard<std::mutex> lock(mu_);
  send_handler_ = std::move(h);
}

void FakeTransport::SetStreamHandler(StreamHandler h) {
  std::lock_guard<std::mutex> lock(mu_);
  stream_handler_ = std::move(h);
}

void FakeTransport::Enqueue(HttpResponse response) {
  std::lock_guard<std::mutex> lock(mu_);
  canned_.push_back(std::move(response));
}

HttpResponse FakeTransport::Send(const HttpRequest& request) {
  SendHandler handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back({request, clock_ ? clock_->Now() : Clock::TimePoint{}, false});
    cv_.notify_all();
    if (!canned_.empty()) {
      HttpResponse r = std::move(canned_.front());
      canned_.pop_front();
      return r;
    }
    handler = send_handler_;
  }
  if (!handler) return StatusResponse(501, "NotImplemented", "no fake answer scripted");
  return handler(request);
}

HttpResponse FakeTransport::OpenStream(const HttpRequest& request,
                                       std::unique_ptr<HttpStream>* stream) {
  StreamHandler handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back({request, clock_ ? clock_->Now() : Clock::TimePoint{}, true});
    cv_.notify_all();
    handler = stream_handler_;
  }
  if (!handler) return StatusResponse(501, "NotImplemented", "no fake stream scripted");
  std::shared_ptr<FakeStreamControl> control;
  HttpResponse r = handler(request, &control);
  if (r.status >= 200 && r.status < 300 && control) {
    *stream = std::make_unique<FakeStream>(std::move(control));
  }
  return r;
}

std::vector<RecordedRequest> FakeTransport::Requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

size_t FakeTransport::RequestCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_.size();
}

bool FakeTransport::WaitForRequests(size_t n, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return requests_.size() >= n; });
}

HttpResponse JsonResponse(int status, const std::string& body, Headers headers) {
  HttpResponse r;
  r.status = status;
  r.headers = std::move(headers);
  r.headers["content-type"] = "application/json";
  r.body = body;
  return r;
}

HttpResponse StatusResponse(int code, const std::string& reason, const std::string& message,
                            int retry_after_seconds) {
  nlohmann::json st = {{"kind", "Status"},
                       {"apiVersion", "v1"},
                       {"status", "Failure"},
                       {"reason", reason},
                       {"message", message},
                       {"code", code},
                       {"metadata", nlohmann::json::object()}};
  Headers h;
  if (retry_after_seconds >= 0) {
    st["details"]["retryAfterSeconds"] = retry_after_seconds;
    h["retry-after"] = std::to_string(retry_after_seconds);
  }
  return JsonResponse(code, st.dump(), std::move(h));
}

HttpResponse ConnectionRefused() {
  HttpResponse r;
  r.status = 0;
  r.error = Unavailable("cannot connect: Connection refused");
  r.request_sent = false;
  return r;
}

}  // namespace spawnpoint::kube::testing
