// The host's account key on disk: one line holding the hex of the 32-byte secp256k1 secret, in a
// file only its owner may read. The daemon refuses a file that group or others can access, so a
// misconfigured deployment fails loudly instead of leaking the key that controls the account.
//
// Thread-safety: pure functions over the file system; thread-safe.
#ifndef TS_SIDECAR_HOST_KEY_FILE_H_
#define TS_SIDECAR_HOST_KEY_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/crypto/secp256k1.h"

namespace ts::sidecar {

// Reads the key. NOT_FOUND if the file does not exist; PERMISSION_DENIED naming the file and
// its mode (octal) if group or others have any access bit, or if it cannot be opened;
// INVALID_ARGUMENT naming the file if it is not a regular file, is not exactly 64 hex digits
// (one optional trailing newline), or is not a valid secret.
absl::StatusOr<common::PrivateKey> LoadKeyFile(const std::string& path);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_KEY_FILE_H_
