// The Kubernetes client's list decoding: kube::Client::List over a transport that answers
// with the input. The first byte picks the HTTP status (200, or an error whose body the
// client decodes as a Status object); the rest is the body. No retries, no sleeping.
#include <memory>
#include <string>

#include "operator/kube/client.h"
#include "operator/kube/log.h"
#include "tests/fuzz/fuzz_input.h"

namespace kube = spawnpoint::kube;

namespace {

class AnswerTransport : public kube::HttpTransport {
 public:
  AnswerTransport(int status, std::string body) : status_(status), body_(std::move(body)) {}
  kube::HttpResponse Send(const kube::HttpRequest&) override {
    kube::HttpResponse r;
    r.status = status_;
    r.headers["content-type"] = "application/json";
    r.body = body_;
    return r;
  }
  kube::HttpResponse OpenStream(const kube::HttpRequest& request,
                                std::unique_ptr<kube::HttpStream>*) override {
    return Send(request);
  }

 private:
  const int status_;
  const std::string body_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int kStatuses[] = {200, 200, 200, 200, 400, 403, 404, 409, 410, 422, 500};
  if (size == 0) return 0;
  const int status = kStatuses[data[0] % (sizeof(kStatuses) / sizeof(kStatuses[0]))];
  std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  kube::RestConfig config;
  config.server = "https://fuzz.invalid";
  kube::ClientOptions options;
  options.qps = 0;
  options.retry.max_attempts = 1;
  options.logger = kube::NullLogger();
  kube::Client client(config, std::make_shared<AnswerTransport>(status, body),
                      spawnpoint::RealClock::Get(), options);
  auto list = client.List(kube::resources::Pods(), "default");
  if (list.ok()) {
    for (const auto& item : list->items) (void)item.dump();
  }
  return 0;
}
