#include "sidecar/cli/context.h"

#include "absl/strings/str_cat.h"
#include "chain-bridge/client/gonka_v0_client.h"
#include "common/key_file.h"
#include "sidecar/cli/output.h"

namespace ts::sidecar {

bridge::ChainClient& Context::chain() {
  if (chain_ == nullptr) {
    bridge::ChainClientOptions options;
    options.call_timeout_ms = options_.timeout_ms;
    options.inclusion_timeout_ms = options_.timeout_ms;
    // The flag is checked by CLI11 (one of the two names).
    auto profile = bridge::ParseChainProfile("--chain-profile", options_.chain_profile);
    chain_ = bridge::NewChainClient(profile.value_or(bridge::ChainProfile::kTrainshard),
                                    options_.chain, options);
  }
  return *chain_;
}

absl::StatusOr<common::PrivateKey> Context::LoadKey(std::string_view command) {
  if (options_.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--key: required by '", std::string(command), "' (a key file to sign with)"));
  }
  auto key = common::ReadKeyFile(options_.key_file);
  if (!key.ok()) {
    return absl::Status(key.status().code(),
                        absl::StrCat("--key: ", std::string(key.status().message())));
  }
  return key;
}

int Context::BadInput(const absl::Status& status) {
  err_ << "error: " << status.message() << "\n";
  return kExitUsage;
}

int Context::LocalFailed(const absl::Status& status) {
  err_ << "error: " << status.message() << "\n";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kOutOfRange:
      return kExitUsage;
    default:
      return kExitRefused;
  }
}

int Context::PeerFailed(std::string_view peer, const absl::Status& status) {
  bool unreachable = absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
  err_ << "error: " << peer << ": " << (unreachable ? "cannot reach: " : "")
       << absl::StatusCodeToString(status.code()) << ": " << status.message() << "\n";
  return unreachable ? kExitUnreachable : kExitRefused;
}

int Context::ChainFailed(const absl::Status& status) {
  return PeerFailed(absl::StrCat("chain ", options_.chain), status);
}

int Context::TxRefused(const cosmos::base::abci::v1beta1::TxResponse& response) {
  err_ << "error: code=" << response.code() << " codespace=" << response.codespace() << ": "
       << response.raw_log() << "\n";
  return kExitRefused;
}

int Context::ReportTx(const cosmos::base::abci::v1beta1::TxResponse& response) {
  if (json()) {
    PrintProtoJson(response);
  } else {
    KeyValues lines = {{"txhash", response.txhash()}, {"code", std::to_string(response.code())}};
    if (response.height() > 0) lines.emplace_back("height", std::to_string(response.height()));
    PrintKeyValues(out_, lines);
  }
  if (response.code() != 0) return TxRefused(response);
  return kExitOk;
}

void Context::PrintJson(const nlohmann::ordered_json& document) {
  // Text from a peer may hold invalid UTF-8; replace it rather than fail.
  out_ << document.dump(-1, ' ', /*ensure_ascii=*/false,
                        nlohmann::ordered_json::error_handler_t::replace)
       << "\n";
  out_.flush();
}

void Context::PrintProtoJson(const google::protobuf::Message& message) {
  out_ << ProtoToJson(message) << "\n";
  out_.flush();
}

}  // namespace ts::sidecar
