// A scripted HttpTransport for unit tests: answers come from a handler the test installs
// (or a FIFO of canned responses), watch streams are fed line by line by the test, and
// every request is recorded with the clock time it was sent. Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "operator/kube/transport.h"

namespace spawnpoint::kube::testing {

// The test's end of one fake watch stream.
class FakeStreamControl {
 public:
  void PushLine(const std::string& line);
  // A clean end of the body.
  void End();
  // The next read (after any pushed lines) fails with `status`.
  void Fail(Status status);
  bool cancelled() const;

  // Reader side.
  StatusOr<std::optional<std::string>> Read();
  void Cancel();

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> lines_;
  bool ended_ = false;
  Status failure_;
  bool cancelled_ = false;
};

struct RecordedRequest {
  HttpRequest request;
  Clock::TimePoint at;
  bool stream = false;
};

class FakeTransport : public HttpTransport {
 public:
  using SendHandler = std::function<HttpResponse(const HttpRequest&)>;
  // Returns the response; for a 2xx answer, sets *control to the stream to feed.
  using StreamHandler =
      std::function<HttpResponse(const HttpRequest&, std::shared_ptr<FakeStreamControl>*)>;

  explicit FakeTransport(Clock* clock = nullptr) : clock_(clock) {}

  void SetSendHandler(SendHandler h);
  void SetStreamHandler(StreamHandler h);
  // Canned answers for Send, used in order before the handler.
  void Enqueue(HttpResponse response);

  HttpResponse Send(const HttpRequest& request) override;
  HttpResponse OpenStream(const HttpRequest& request, std::unique_ptr<HttpStream>* stream) override;

  std::vector<RecordedRequest> Requests() const;
  size_t RequestCount() const;
  // Blocks (real time) until at least n requests were made.
  bool WaitForRequests(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  Clock* clock_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<HttpResponse> canned_;
  SendHandler send_handler_;
  StreamHandler stream_handler_;
  std::vector<RecordedRequest> requests_;
};

// Helpers to build answers.
HttpResponse JsonResponse(int status, const std::string& body, Headers headers = {});
// A metav1.Status failure body with reason, message and optional causes/retryAfterSeconds.
HttpResponse StatusResponse(int code, const std::string& reason, const std::string& message,
                            int retry_after_seconds = -1);
HttpResponse ConnectionRefused();

}  // namespace spawnpoint::kube::testing
