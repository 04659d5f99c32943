#include "sidecar/peer/peer_tls.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hex.h"
#include "common/log.h"

namespace ts::sidecar {
namespace {

// Accepts the peer's leaf certificate when its DER hashes to the pinned fingerprint.
class PinnedCertificateVerifier final : public grpc::experimental::ExternalCertificateVerifier {
 public:
  explicit PinnedCertificateVerifier(std::string cert_sha256)
      : cert_sha256_(std::move(cert_sha256)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)>, grpc::Status* sync_status) override {
    const grpc::string_ref pem = request->peer_cert();
    auto presented = common::CertificateSha256(std::string_view(pem.data(), pem.size()));
    if (presented.ok() && *presented == cert_sha256_) {
      *sync_status = grpc::Status::OK;
      return true;  // done synchronously
    }
    const std::string got = presented.ok() ? common::HexEncode(*presented) : "none";
    common::Log(
        common::LogLevel::kWarn, "peer_tls", "peer certificate refused",
        {{"target", std::string(request->target_name().data(), request->target_name().size())},
         {"presented_sha256", got},
         {"pinned_sha256", common::HexEncode(cert_sha256_)}});
    *sync_status = grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        absl::StrCat("peer certificate ", got, " is not the one its reservation pins (",
                     common::HexEncode(cert_sha256_), ")"));
    return true;
  }

  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  const std::string cert_sha256_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials(
    const common::TlsIdentity* identity) {
  if (identity == nullptr) return grpc::InsecureServerCredentials();
  auto provider = std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
      std::vector<grpc::experimental::IdentityKeyCertPair>{
          {identity->key_pem, identity->cert_pem}});
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  // Peers prove who they are by signing each request (peer_auth.h), not by a certificate.
  options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> PeerChannelCredentials(const std::string& cert_sha256) {
  if (cert_sha256.empty()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  // No certificate authority and no host name: the verifier below is the whole check.
  options.set_verify_server_certs(false);
  options.set_check_call_host(false);
  options.set_certificate_verifier(
      grpc::experimental::ExternalCertificateVerifier::Create<PinnedCertificateVerifier>(
          cert_sha256));
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace ts::sidecar
