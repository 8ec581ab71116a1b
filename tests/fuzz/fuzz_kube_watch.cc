// The Kubernetes client's watch-stream decoding: the input is the body of a watch response,
// read line by line through kube::WatchStream::Next until the stream ends or fails (ERROR
// events decode the Status object they carry, kube::ApiErrorFromStatusObject).
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "operator/kube/client.h"
#include "tests/fuzz/fuzz_input.h"

namespace kube = spawnpoint::kube;

namespace {

// The body, one newline-terminated line per read; a last line without a newline ends the
// body as a cut connection does.
class BytesStream : public kube::HttpStream {
 public:
  explicit BytesStream(std::string_view body) : body_(body) {}
  spawnpoint::StatusOr<std::optional<std::string>> ReadLine() override {
    if (body_.empty()) return std::optional<std::string>();
    size_t nl = body_.find('\n');
    if (nl == std::string_view::npos) {
      body_ = {};
      return spawnpoint::Unavailable("connection closed mid-line");
    }
    std::string line(body_.substr(0, nl));
    body_.remove_prefix(nl + 1);
    return std::optional<std::string>(std::move(line));
  }
  void Cancel() override {}

 private:
  std::string_view body_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  kube::WatchStream watch(std::make_unique<BytesStream>(body), "watch fuzz");
  for (;;) {
    auto event = watch.Next();
    if (!event.ok() || !event->has_value()) break;
    (void)kube::WatchEventTypeName((*event)->type);
    (void)(*event)->object.dump();
  }
  return 0;
}
