// TLS for a host's peer-facing gRPC channels (docs/threat-model.md, "TLS between hosts"): the
// server side presents the host's own certificate (common/crypto/tls_identity.h); the client
// side accepts exactly the certificate whose SHA-256 the chain's reservation holds for the peer
// it dials — no certificate authority, no host name: the chain is the only root of trust. A
// peer presenting any other certificate fails the handshake (UNAVAILABLE to the caller, the
// fingerprints in the log), before a request leaves this host.
//
// Null identities and empty fingerprints mean plaintext: the trusted-network switch
// (`peer_tls = false` in the host's config), for a private network and for benchmarks.
//
// Thread-safety: free functions; the credentials they return are thread-safe.
#ifndef TS_SIDECAR_PEER_PEER_TLS_H_
#define TS_SIDECAR_PEER_PEER_TLS_H_

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "common/crypto/tls_identity.h"

namespace ts::sidecar {

// TLS with `identity` (not owned; copied), or insecure credentials when it is null.
std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials(const common::TlsIdentity* identity);

// TLS that accepts only a certificate whose DER hashes to `cert_sha256` (32 bytes), or insecure
// credentials when it is empty.
std::shared_ptr<grpc::ChannelCredentials> PeerChannelCredentials(const std::string& cert_sha256);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_PEER_PEER_TLS_H_
