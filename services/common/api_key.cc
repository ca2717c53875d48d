#include "services/common/api_key.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::services {
namespace {

constexpr size_t kMaxKeyFileBytes = 1 << 20;
constexpr size_t kMaxKeyBytes = 4096;

grpc::Status Unauthenticated(const std::string& message) {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, message);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseApiKeys(std::string_view text) {
  std::vector<std::string> keys;
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#') continue;
    if (line.size() > kMaxKeyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": key longer than ", kMaxKeyBytes, " bytes"));
    }
    for (char c : line) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (u <= 0x20 || u >= 0x7f) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line_no, ": a key must be printable ASCII without spaces"));
      }
    }
    keys.emplace_back(line);
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError("no key in it (only blank lines and # comments)");
  }
  return keys;
}

absl::StatusOr<std::vector<std::string>> LoadApiKeyFile(const std::string& path) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("--api-key-file ", path, ": ", what));
  };
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return bad("no such file");
  if (!S_ISREG(st.st_mode)) return bad("not a regular file");
  if (static_cast<size_t>(st.st_size) > kMaxKeyFileBytes) return bad("larger than 1 MiB");
  std::ifstream f(path, std::ios::binary);
  if (!f.good()) return bad("cannot be read (permissions?)");
  std::stringstream ss;
  ss << f.rdbuf();
  if (st.st_size > 0 && ss.str().empty()) return bad("cannot be read");
  absl::StatusOr<std::vector<std::string>> keys = ParseApiKeys(ss.str());
  if (!keys.ok()) return bad(std::string(keys.status().message()));
  return keys;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Loops over the configured key `b` in full; the length difference is
  // folded in rather than returned early.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}

grpc::Status ApiKeySet::CheckHeader(const std::string* authorization) const {
  if (keys_.empty()) return grpc::Status::OK;
  if (authorization == nullptr) {
    return Unauthenticated(
        "missing API key: send gRPC metadata 'authorization: Bearer <key>' (tandem client "
        "--api-key or $TANDEM_API_KEY)");
  }
  constexpr std::string_view kBearer = "bearer ";
  if (authorization->size() <= kBearer.size() ||
      !absl::EqualsIgnoreCase(absl::string_view(authorization->data(), kBearer.size()),
                              absl::string_view(kBearer.data(), kBearer.size()))) {
    return Unauthenticated("malformed authorization metadata: expected 'Bearer <key>'");
  }
  const std::string_view presented = std::string_view(*authorization).substr(kBearer.size());
  bool match = false;
  for (const std::string& key : keys_) match |= ConstantTimeEquals(presented, key);
  if (!match) return Unauthenticated("invalid API key");
  return grpc::Status::OK;
}

grpc::Status ApiKeySet::Check(const grpc::ServerContextBase& context) const {
  if (keys_.empty()) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find(kAuthorizationMetadataKey);
  if (it == md.end()) return CheckHeader(nullptr);
  if (md.count(kAuthorizationMetadataKey) > 1) {
    return Unauthenticated("more than one authorization metadata entry");
  }
  const std::string value(it->second.data(), it->second.size());
  return CheckHeader(&value);
}

}  // namespace tandem::services
