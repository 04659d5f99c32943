#include "sidecar/cli/parse.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/hex.h"
#include "common/regular_file.h"
#include "common/status.h"

namespace ts::sidecar {
namespace pb = ::gonka::trainshard::v1;
namespace {

// Values are quoted and cut, so a long or odd value cannot flood the terminal.
std::string Quote(const std::string& text) {
  constexpr size_t kShownMax = 120;
  std::string shown = text.size() > kShownMax ? text.substr(0, kShownMax) + "..." : text;
  return absl::StrCat("\"", shown, "\"");
}

absl::Status Bad(const std::string& flag, const std::string& text, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(flag, " ", Quote(text), ": ", why));
}

absl::StatusOr<AddressValue> ParsePair(const std::string& flag, const std::string& text,
                                       const std::string& shape, const std::string& what) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    return Bad(flag, text, absl::StrCat("expected ", shape));
  }
  AddressValue result;
  result.address = text.substr(0, eq);
  auto id = common::ParseAddress("address", result.address);
  if (!id.ok()) return Bad(flag, text, std::string(id.status().message()));
  auto value = common::ParseAmount(what, text.substr(eq + 1));
  if (!value.ok()) return Bad(flag, text, std::string(value.status().message()));
  result.value = *value;
  return result;
}

absl::StatusOr<std::vector<AddressValue>> ParsePairs(
    const std::string& flag, const std::vector<std::string>& texts,
    absl::StatusOr<AddressValue> (*parse)(const std::string&, const std::string&)) {
  if (texts.size() > kFlagValuesMax) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", texts.size(), " values is more than ", kFlagValuesMax));
  }
  std::vector<AddressValue> result;
  std::set<std::string> seen;
  for (const auto& text : texts) {
    auto pair = parse(flag, text);
    if (!pair.ok()) return pair.status();
    if (!seen.insert(pair->address).second) {
      return Bad(flag, text, absl::StrCat("address ", pair->address, " is given twice"));
    }
    result.push_back(*std::move(pair));
  }
  return result;
}

}  // namespace

absl::StatusOr<AddressValue> ParseAddressAmount(const std::string& flag, const std::string& text) {
  return ParsePair(flag, text, "ADDR=AMOUNT", "amount");
}

absl::StatusOr<AddressValue> ParseAddressWeight(const std::string& flag, const std::string& text) {
  return ParsePair(flag, text, "ADDR=WEIGHT", "weight");
}

absl::StatusOr<std::vector<AddressValue>> ParseAddressAmounts(
    const std::string& flag, const std::vector<std::string>& texts) {
  return ParsePairs(flag, texts, &ParseAddressAmount);
}

absl::StatusOr<std::vector<AddressValue>> ParseAddressWeights(
    const std::string& flag, const std::vector<std::string>& texts) {
  return ParsePairs(flag, texts, &ParseAddressWeight);
}

absl::StatusOr<std::string> ParseAccountAddress(const std::string& flag, const std::string& text) {
  auto id = common::ParseAddress("address", text);
  if (!id.ok()) return Bad(flag, text, std::string(id.status().message()));
  return text;
}

absl::StatusOr<uint64_t> ParseAmountFlag(const std::string& flag, const std::string& text) {
  auto value = common::ParseAmount("amount", text);
  if (!value.ok()) return Bad(flag, text, std::string(value.status().message()));
  return *value;
}

absl::StatusOr<std::string> ParseHex32(const std::string& flag, const std::string& text) {
  if (text.size() != 64) {
    return Bad(flag, text, absl::StrCat("expected 64 hex characters, found ", text.size()));
  }
  auto bytes = common::HexDecode(text);
  if (!bytes.ok()) return Bad(flag, text, "not hexadecimal");
  return *std::move(bytes);
}

namespace {

absl::StatusOr<std::string> ParseHostPort(const std::string& flag, const std::string& text,
                                          bool allow_port_zero) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return Bad(flag, text, "expected HOST:PORT");
  }
  std::string host = text.substr(0, colon);
  if (host.front() == '[' && host.back() != ']') return Bad(flag, text, "unclosed '[' in host");
  if (host.front() != '[' && host.find(':') != std::string::npos) {
    return Bad(flag, text, "an IPv6 host must be written in brackets, [::1]:PORT");
  }
  for (char c : host) {
    if (c <= ' ' || c == '/' || c == ',' || c == '@') return Bad(flag, text, "invalid host");
  }
  std::string port = text.substr(colon + 1);
  if (port.size() > 5) return Bad(flag, text, "port is too long");
  uint32_t number = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return Bad(flag, text, "port is not a number");
    number = number * 10 + static_cast<uint32_t>(c - '0');
  }
  if ((number == 0 && !allow_port_zero) || number > 65535) {
    return Bad(flag, text, allow_port_zero ? "port is not in 0..65535" : "port is not in 1..65535");
  }
  return text;
}

}  // namespace

absl::StatusOr<std::string> ParseEndpoint(const std::string& flag, const std::string& text) {
  return ParseHostPort(flag, text, /*allow_port_zero=*/false);
}

absl::StatusOr<std::string> ParseListenAddress(const std::string& flag, const std::string& text) {
  return ParseHostPort(flag, text, /*allow_port_zero=*/true);
}

absl::StatusOr<std::string> ParseHostTarget(const std::string& flag, const std::string& text) {
  const std::string kUnix = "unix:";
  std::string path;
  if (text.rfind(kUnix, 0) == 0) {
    path = text.substr(kUnix.size());
    if (path.empty() || path.front() != '/') {
      return Bad(flag, text, "expected unix:/ABSOLUTE/PATH of the sidecar's socket");
    }
  } else if (!text.empty() && (text.front() == '/' || text.front() == '.')) {
    path = text;
  } else {
    return ParseEndpoint(flag, text);
  }
  if (path.find('\0') != std::string::npos || path.size() > 4096) {
    return Bad(flag, text, "is not a usable path");
  }
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    // A data dir: the sidecar writes the operator socket's address there.
    const std::string addr_file = path + "/operator.addr";
    auto addr = common::ReadRegularFile("operator.addr", addr_file, 4096);
    if (!addr.ok()) {
      return Bad(flag, text,
                 absl::StrCat("a folder without a readable operator.addr (is the sidecar running "
                              "with this data dir?): ",
                              addr.status().message()));
    }
    std::string target(absl::StripAsciiWhitespace(*addr));
    if (target.empty()) return Bad(flag, text, absl::StrCat(addr_file, " is empty"));
    return target;
  }
  if (path.front() != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof(cwd)) == nullptr) return Bad(flag, text, "cannot resolve the path");
    path = absl::StrCat(cwd, "/", path);
  }
  if (path.size() > 107) {
    return Bad(flag, text, "is longer than a Unix socket path may be (107 bytes)");
  }
  return absl::StrCat(kUnix, path);
}

namespace {

// "A,B,C", each item through `parse`; empty items, values that parse to the same thing and more
// than kFlagValuesMax items are refused.
absl::StatusOr<std::vector<std::string>> ParseList(
    const std::string& flag, const std::string& text,
    absl::StatusOr<std::string> (*parse)(const std::string&, const std::string&)) {
  std::vector<std::string> items = absl::StrSplit(text, ',');
  if (items.size() > kFlagValuesMax) {
    return Bad(flag, text, absl::StrCat(items.size(), " entries is more than ", kFlagValuesMax));
  }
  std::vector<std::string> result;
  std::set<std::string> seen;
  for (const auto& item : items) {
    if (item.empty()) return Bad(flag, text, "empty entry");
    TS_ASSIGN_OR_RETURN(std::string value, parse(flag, item));
    if (!seen.insert(value).second) return Bad(flag, text, absl::StrCat(item, " is given twice"));
    result.push_back(std::move(value));
  }
  return result;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseHostTargetList(const std::string& flag,
                                                             const std::string& text) {
  return ParseList(flag, text, &ParseHostTarget);
}

absl::StatusOr<std::vector<std::string>> ParseEndpointList(const std::string& flag,
                                                           const std::string& text) {
  return ParseList(flag, text, &ParseEndpoint);
}

absl::StatusOr<pb::ShardStatus> ParseShardStatus(const std::string& flag, const std::string& text) {
  static const std::pair<const char*, pb::ShardStatus> kNames[] = {
      {"proposed", pb::SHARD_STATUS_PROPOSED}, {"open", pb::SHARD_STATUS_OPEN},
      {"running", pb::SHARD_STATUS_RUNNING},   {"settled", pb::SHARD_STATUS_SETTLED},
      {"expired", pb::SHARD_STATUS_EXPIRED},   {"rejected", pb::SHARD_STATUS_REJECTED},
  };
  for (const auto& [name, status] : kNames) {
    if (text == name) return status;
  }
  return Bad(flag, text, "expected one of proposed|open|running|settled|expired|rejected");
}

absl::StatusOr<cosmos::gov::v1::VoteOption> ParseVoteOption(const std::string& flag,
                                                            const std::string& text) {
  if (text == "yes") return cosmos::gov::v1::VOTE_OPTION_YES;
  if (text == "no") return cosmos::gov::v1::VOTE_OPTION_NO;
  if (text == "abstain") return cosmos::gov::v1::VOTE_OPTION_ABSTAIN;
  if (text == "veto") return cosmos::gov::v1::VOTE_OPTION_NO_WITH_VETO;
  return Bad(flag, text, "expected one of yes|no|abstain|veto");
}

absl::StatusOr<std::string> ReadInputFile(const std::string& flag, const std::string& path) {
  // Opened without blocking and type-checked on the open descriptor: a FIFO or a device under
  // the name is refused at once instead of waited on.
  return common::ReadRegularFile(flag, path, kInputFileBytesMax);
}

}  // namespace ts::sidecar
