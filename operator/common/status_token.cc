#include "operator/common/status_token.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/random.h"

namespace spawnpoint::op {

StatusOr<StatusTokens> StatusTokens::FromFile(const std::string& path) {
  StatusOr<std::string> read = ReadSecretFile(path);
  const bool empty = !read.ok() && read.status().code() == StatusCode::kInvalidArgument;
  if (!read.ok() && !empty) {
    return InvalidArgument("--status-token-key-file " + path + ": cannot read it");
  }
  std::string key = empty ? "" : *std::move(read);
  if (key.size() < kMinStatusTokenKeyBytes) {
    return InvalidArgument("--status-token-key-file " + path + ": " + std::to_string(key.size()) +
                           " bytes; the key needs at least " +
                           std::to_string(kMinStatusTokenKeyBytes) +
                           " (e.g. head -c 32 /dev/urandom | base64)");
  }
  return StatusTokens(std::move(key));
}

StatusOr<StatusTokens> StatusTokens::Random() {
  SP_ASSIGN_OR_RETURN(std::string key, RandomHex(kMinStatusTokenKeyBytes));
  return StatusTokens(std::move(key));
}

std::string StatusTokens::For(const std::string& ns, const std::string& name,
                              const std::string& uid) const {
  // Names and namespaces are DNS labels and subdomains: no newline, so the message is unique.
  const std::string message = "spawnpoint-status\n" + ns + "\n" + name + "\n" + uid;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  return HexEncode(std::string_view(reinterpret_cast<const char*>(mac), len));
}

}  // namespace spawnpoint::op
