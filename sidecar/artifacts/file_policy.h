// Where the artifact operator API may read and write files on the host's disk. `Publish` reads
// every regular file under a folder and `Fetch`/`Export` write an artifact's files into one; both
// run as the host's user, who can read its key file and its records. The policy keeps those
// calls to the folders meant for them (docs/threat-model.md):
//
// - the operator's own folder, `files_root` from the config (none unless it is set), and
// - a shard's own work folder, <shards_dir>/<shard_id>/ (where the shard process writes its data
//   and checkpoints), for calls about that shard only, and never its records (<...>/state);
//
// and never a protected path (the data dir, the artifact stores, the key file), nor a folder
// that holds one (publishing a parent of the data dir would publish the key and records too),
// whatever files_root says. Paths are compared after resolving links (realpath), so a link
// cannot lead a call out of its folder at check time.
//
// Thread-safety: immutable after construction; Check is safe from any thread.
#ifndef TS_SIDECAR_ARTIFACTS_FILE_POLICY_H_
#define TS_SIDECAR_ARTIFACTS_FILE_POLICY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace ts::sidecar {

struct ProtectedPath {
  std::string what;  // "the data dir", "the host key file"
  std::string path;  // absolute
};

struct OperatorFilePolicy {
  // Absolute, or empty: no folder outside the shards' own is allowed.
  std::string files_root;
  // Absolute, or empty: no shard folder is allowed.
  std::string shards_dir;
  std::vector<ProtectedPath> protected_paths;
};

// OK if `path` (absolute; it need not exist yet) may be read from or written to by a call about
// `shard_id` under `policy`. PERMISSION_DENIED naming `field`, the path and why otherwise: outside
// files_root and the shard's folder (saying whether files_root is set), inside the shard's
// records, inside or holding a protected path (naming it).
absl::Status CheckOperatorPath(const OperatorFilePolicy& policy, std::string_view field,
                               const std::string& path, uint64_t shard_id);

// `path` with its links resolved: realpath of the longest existing prefix, then the rest, made
// lexically normal ("a/./b/../c" → "a/c"). Absolute in, absolute out.
std::string ResolvePath(const std::string& path);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_ARTIFACTS_FILE_POLICY_H_
