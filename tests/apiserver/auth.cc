#include "tests/apiserver/auth.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string_view>

#include "tests/apiserver/util.h"

namespace spawnpoint::kubetest {
namespace {

using Clock = std::chrono::system_clock;

// --- A reader for the few protobuf messages of the review APIs. ---

enum class FieldType { kString, kStrings, kInt, kMessage };

struct ProtoField {
  int number;
  const char* name;
  FieldType type;
  const std::vector<ProtoField>* message = nullptr;
};
using ProtoSchema = std::vector<ProtoField>;

// authorization/v1 and authentication/v1 generated.proto.
const ProtoSchema kResourceAttributes = {
    {1, "namespace", FieldType::kString}, {2, "verb", FieldType::kString},
    {3, "group", FieldType::kString},     {4, "version", FieldType::kString},
    {5, "resource", FieldType::kString},  {6, "subresource", FieldType::kString},
    {7, "name", FieldType::kString},
};
const ProtoSchema kNonResourceAttributes = {
    {1, "path", FieldType::kString},
    {2, "verb", FieldType::kString},
};
const ProtoSchema kSelfSubjectAccessReviewSpec = {
    {1, "resourceAttributes", FieldType::kMessage, &kResourceAttributes},
    {2, "nonResourceAttributes", FieldType::kMessage, &kNonResourceAttributes},
};
const ProtoSchema kSubjectAccessReviewSpec = {
    {1, "resourceAttributes", FieldType::kMessage, &kResourceAttributes},
    {2, "nonResourceAttributes", FieldType::kMessage, &kNonResourceAttributes},
    {3, "user", FieldType::kString},
    {4, "groups", FieldType::kStrings},
    {6, "uid", FieldType::kString},
};
const ProtoSchema kSelfSubjectRulesReviewSpec = {{1, "namespace", FieldType::kString}};
const ProtoSchema kBoundObjectReference = {
    {1, "kind", FieldType::kString},
    {2, "apiVersion", FieldType::kString},
    {3, "name", FieldType::kString},
    {4, "uid", FieldType::kString},
};
const ProtoSchema kTokenRequestSpec = {
    {1, "audiences", FieldType::kStrings},
    {3, "boundObjectRef", FieldType::kMessage, &kBoundObjectReference},
    {4, "expirationSeconds", FieldType::kInt},
};
const ProtoSchema kTokenReviewSpec = {
    {1, "token", FieldType::kString},
    {2, "audiences", FieldType::kStrings},
};
const ProtoSchema kNoFields = {};

class ProtoReader {
 public:
  explicit ProtoReader(std::string_view data) : data_(data) {}
  bool done() const { return pos_ >= data_.size(); }
  bool ok() const { return ok_; }

  // Reads one field: its number, and either a varint or length-delimited bytes.
  bool Next(int* number, int* wire, uint64_t* varint, std::string_view* bytes) {
    uint64_t key;
    if (!Varint(&key)) return false;
    *number = static_cast<int>(key >> 3);
    *wire = static_cast<int>(key & 7);
    switch (*wire) {
      case 0:
        return Varint(varint);
      case 1:
        return Skip(8);
      case 5:
        return Skip(4);
      case 2: {
        uint64_t n;
        if (!Varint(&n) || n > data_.size() - pos_) return Fail();
        *bytes = data_.substr(pos_, n);
        pos_ += n;
        return true;
      }
      default:
        return Fail();
    }
  }

 private:
  bool Fail() {
    ok_ = false;
    return false;
  }
  bool Skip(size_t n) {
    if (n > data_.size() - pos_) return Fail();
    pos_ += n;
    return true;
  }
  bool Varint(uint64_t* out) {
    *out = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return Fail();
      uint8_t b = static_cast<uint8_t>(data_[pos_++]);
      *out |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return Fail();
  }

  std::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

bool DecodeMessage(std::string_view data, const ProtoSchema& schema, json* out) {
  *out = json::object();
  ProtoReader r(data);
  while (!r.done()) {
    int number = 0, wire = 0;
    uint64_t varint = 0;
    std::string_view bytes;
    if (!r.Next(&number, &wire, &varint, &bytes)) return false;
    auto f = std::find_if(schema.begin(), schema.end(),
                          [&](const ProtoField& p) { return p.number == number; });
    if (f == schema.end()) continue;
    switch (f->type) {
      case FieldType::kString:
        if (wire == 2) (*out)[f->name] = std::string(bytes);
        break;
      case FieldType::kStrings:
        if (wire == 2) {
          if (!out->contains(f->name)) (*out)[f->name] = json::array();
          (*out)[f->name].push_back(std::string(bytes));
        }
        break;
      case FieldType::kInt:
        if (wire == 0) (*out)[f->name] = static_cast<int64_t>(varint);
        break;
      case FieldType::kMessage:
        if (wire == 2) {
          json sub;
          if (!DecodeMessage(bytes, *f->message, &sub)) return false;
          (*out)[f->name] = sub;
        }
        break;
    }
  }
  return r.ok();
}

const ProtoSchema& SpecSchema(ReviewKind kind) {
  switch (kind) {
    case ReviewKind::kTokenRequest:
      return kTokenRequestSpec;
    case ReviewKind::kSelfSubjectAccessReview:
      return kSelfSubjectAccessReviewSpec;
    case ReviewKind::kSubjectAccessReview:
      return kSubjectAccessReviewSpec;
    case ReviewKind::kSelfSubjectRulesReview:
      return kSelfSubjectRulesReviewSpec;
    case ReviewKind::kTokenReview:
      return kTokenReviewSpec;
    case ReviewKind::kSelfSubjectReview:
      return kNoFields;
  }
  return kNoFields;
}

}  // namespace

UserInfo AdminUser() {
  UserInfo u;
  u.name = kAdminUserName;
  u.groups = {kSystemMasters, kAllAuthenticated};
  return u;
}

std::string BearerToken(const std::string& authorization) {
  size_t sp = authorization.find(' ');
  if (sp == std::string::npos) return "";
  if (Lower(authorization.substr(0, sp)) != "bearer") return "";
  std::string token = authorization.substr(sp + 1);
  token.erase(0, token.find_first_not_of(' '));
  token.erase(token.find_last_not_of(' ') + 1);
  return token;
}

std::string Tokens::Issue(const std::string& ns, const std::string& name, const std::string& uid,
                          std::chrono::seconds expiration, std::vector<std::string> audiences) {
  auto now = Clock::now();
  int64_t iat = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
  if (audiences.empty()) audiences = {kApiAudience};
  json claims = {
      {"aud", audiences},
      {"iat", iat},
      {"iss", kApiAudience},
      {"nbf", iat},
      {"sub", ServiceAccountUserName(ns, name)},
      {"kubernetes.io", {{"namespace", ns}, {"serviceaccount", {{"name", name}, {"uid", uid}}}}}};
  ServiceAccountToken t{ns, name, uid, audiences, std::nullopt};
  if (expiration.count() > 0) {
    t.expires = now + expiration;
    claims["exp"] = iat + expiration.count();
  }
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string signature;
  for (int i = 0; i < 4; ++i) {
    uint64_t v = rng();
    signature.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  std::string token = Base64Encode(R"({"alg":"RS256","kid":"kube-test-server"})", true) + "." +
                      Base64Encode(claims.dump(), true) + "." + Base64Encode(signature, true);
  std::lock_guard<std::mutex> lock(mu_);
  tokens_[token] = std::move(t);
  return token;
}

Tokens::Lookup Tokens::Find(const std::string& token, Clock::time_point now) const {
  Lookup l;
  if (token.empty()) {
    l.error = "no bearer token";
    return l;
  }
  if (token == kAdminToken) {
    l.kind = Kind::kAdmin;
    return l;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tokens_.find(token);
  if (it == tokens_.end()) {
    l.error = "invalid bearer token";
    return l;
  }
  const auto& t = it->second;
  if (t.expires && now >= *t.expires) {
    l.error = "token has expired";
    return l;
  }
  if (std::find(t.audiences.begin(), t.audiences.end(), kApiAudience) == t.audiences.end()) {
    l.error = "token audiences do not include the API server's";
    return l;
  }
  l.kind = Kind::kServiceAccount;
  l.sa = t;
  return l;
}

StatusOr<json> DecodeReviewBody(ReviewKind kind, const std::string& content_type,
                                const std::string& body) {
  if (body.empty()) return json::object();
  if (content_type.find("protobuf") == std::string::npos) {
    json j = json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return InvalidArgument(
          "couldn't get version/kind; json parse error: the body is not valid JSON");
    }
    return j;
  }
  static const std::string kMagic("k8s\0", 4);
  if (body.compare(0, kMagic.size(), kMagic) != 0) {
    return InvalidArgument("provided protobuf body does not start with the k8s magic number");
  }
  // runtime.Unknown: 1 typeMeta, 2 raw (the object), 3 contentEncoding, 4 contentType.
  ProtoReader envelope(std::string_view(body).substr(kMagic.size()));
  std::string_view raw;
  while (!envelope.done()) {
    int number = 0, wire = 0;
    uint64_t varint = 0;
    std::string_view bytes;
    if (!envelope.Next(&number, &wire, &varint, &bytes)) break;
    if (number == 2 && wire == 2) raw = bytes;
  }
  if (!envelope.ok()) return InvalidArgument("the protobuf body is truncated");
  // The object: 1 metadata, 2 spec (3 status is ignored).
  json object = json::object();
  ProtoReader r(raw);
  while (!r.done()) {
    int number = 0, wire = 0;
    uint64_t varint = 0;
    std::string_view bytes;
    if (!r.Next(&number, &wire, &varint, &bytes)) break;
    if (number == 2 && wire == 2) {
      json spec;
      if (!DecodeMessage(bytes, SpecSchema(kind), &spec)) {
        return InvalidArgument("the protobuf body is truncated");
      }
      object["spec"] = spec;
    }
  }
  if (!r.ok()) return InvalidArgument("the protobuf body is truncated");
  return object;
}

StatusOr<Attributes> AttributesFromReviewSpec(const json& spec) {
  json ra = spec.is_object() ? spec.value("resourceAttributes", json()) : json();
  json nra = spec.is_object() ? spec.value("nonResourceAttributes", json()) : json();
  bool has_ra = ra.is_object();
  bool has_nra = nra.is_object();
  if (has_ra == has_nra) {
    return InvalidArgument(has_ra ? "cannot be specified in combination with resourceAttributes"
                                  : "exactly one of nonResourceAttributes or resourceAttributes "
                                    "must be specified");
  }
  Attributes a;
  if (has_nra) {
    a.path = Str(nra, "path");
    a.verb = Str(nra, "verb");
    return a;
  }
  a.resource_request = true;
  a.ns = Str(ra, "namespace");
  a.verb = Str(ra, "verb");
  a.api_group = Str(ra, "group");
  a.api_version = Str(ra, "version");
  a.resource = Str(ra, "resource");
  a.subresource = Str(ra, "subresource");
  a.name = Str(ra, "name");
  return a;
}

}  // namespace spawnpoint::kubetest
