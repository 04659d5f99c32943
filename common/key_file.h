// Account key files: the hex of a 32-byte secp256k1 secret followed by a newline, readable by its
// owner only (mode 0600). Shared by the `trainshard` CLI and the host sidecar so both refuse the
// same unsafe files with the same words.
//
// Thread-safety: free functions without shared state; safe to call from any thread.
#ifndef TS_COMMON_KEY_FILE_H_
#define TS_COMMON_KEY_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/crypto/secp256k1.h"

namespace ts::common {

// Reads the key at `path`. The secret itself never appears in an error message.
// Errors: NOT_FOUND if the file does not exist; PERMISSION_DENIED if group or others may access
// it (the message names the mode, e.g. 0644) or it cannot be opened; FAILED_PRECONDITION if it is
// not a regular file or is larger than 4096 bytes; INVALID_ARGUMENT if its content is not
// the hex of a valid 32-byte secret (surrounding whitespace is ignored).
absl::StatusOr<PrivateKey> ReadKeyFile(const std::string& path);

// Writes `key` to a new file at `path` with mode 0600. The file appears complete or not at all
// (written to a temporary name in the same directory, synced, then linked to `path`).
// Errors: ALREADY_EXISTS if `path` exists (it is never overwritten); NOT_FOUND if its directory
// does not exist; INTERNAL for other I/O failures, naming the call and errno text.
absl::Status WriteNewKeyFile(const std::string& path, const PrivateKey& key);

}  // namespace ts::common

#endif  // TS_COMMON_KEY_FILE_H_
