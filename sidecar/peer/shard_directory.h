// ShardDirectory: who the members of a shard are (address, shard endpoint, frozen weight) and
// its artifact quota, as the chain records them. Every peer-facing service asks it before
// serving a request; every client asks it where to connect.
//
// ChainShardDirectory reads the chain through a ChainClient and caches each shard for ttl_ms;
// an address not found among the members triggers one refresh (at most once per
// min_refresh_ms per shard), so a host that just reserved is recognised without hammering the
// chain for every request of a non-member. Peers choose the shard ids their requests name, so
// chain queries are also bounded overall: at most max_chain_queries_per_s (a token bucket of as
// many), beyond which a cached view is served however old it is and a shard not in the cache is
// UNAVAILABLE. A lookup answered from the cache never waits for a chain query in progress.
//
// Thread-safety: implementations are thread-safe.
#ifndef TS_SIDECAR_PEER_SHARD_DIRECTORY_H_
#define TS_SIDECAR_PEER_SHARD_DIRECTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "chain-bridge/client/chain_client.h"
#include "common/clock.h"
#include "gonka/trainshard/v1/chain.pb.h"

namespace ts::sidecar {

namespace pb = ::gonka::trainshard::v1;

struct ShardMember {
  std::string address;
  std::string endpoint;  // host:port of its shard services
  uint64_t weight = 0;
  // SHA-256 of the certificate its shard services present (32 bytes; peer_tls.h pins it).
  std::string tls_cert_sha256 = {};
};

struct ShardView {
  uint64_t shard_id = 0;
  pb::ShardStatus status = pb::SHARD_STATUS_UNSPECIFIED;
  std::vector<ShardMember> members;  // in reservation order
  uint64_t quota_bytes_max = 0;
  uint64_t quota_files_max = 0;
  // Who may read the shard's checkpoints without being a member: the proposal's creator (the
  // payer) and the spec's readers (docs/artifacts.md, "Readers").
  std::string creator;
  std::vector<std::string> readers;

  // Nullptr if `address` holds no reservation.
  const ShardMember* Find(std::string_view address) const;
  // Whether `address` is the creator or one of the readers.
  bool IsReader(std::string_view address) const;
};

// What a signer of a read request is to the shard.
enum class ShardRole { kMember, kReader };

class ShardDirectory {
 public:
  virtual ~ShardDirectory() = default;
  // NOT_FOUND if the chain has no such shard; UNAVAILABLE if the chain cannot be reached (or,
  // for ChainShardDirectory, its query budget is spent) and nothing is cached.
  virtual absl::StatusOr<ShardView> Get(uint64_t shard_id) = 0;
  // OK if `address` is a member of the shard, refreshing once as described above.
  // PERMISSION_DENIED "host <address> is not a member of shard <id>"; FAILED_PRECONDITION if
  // the shard never had members (proposed, rejected); members of open, running, settled and
  // expired shards are members. Errors of Get.
  virtual absl::Status CheckMember(uint64_t shard_id, std::string_view address) = 0;
  // kMember or kReader (ShardView::IsReader) if `address` may read the shard's artifacts,
  // refreshing once as CheckMember. PERMISSION_DENIED "<address> is neither a member nor a
  // reader of shard <id>"; the other errors of CheckMember.
  virtual absl::StatusOr<ShardRole> CheckReader(uint64_t shard_id, std::string_view address) = 0;
};

struct ChainShardDirectoryOptions {
  int64_t ttl_ms = 5000;
  int64_t min_refresh_ms = 1000;
  // Chain queries a second, with a burst of as many. 20 keep 100 shards fresh at the 5 s ttl;
  // requests naming random shard ids cannot make more.
  int64_t max_chain_queries_per_s = 20;
};

class ChainShardDirectory final : public ShardDirectory {
 public:
  // `chain` and `clock` are not owned; `chain` is used by one thread at a time.
  ChainShardDirectory(bridge::ChainClient* chain, common::Clock* clock,
                      ChainShardDirectoryOptions options = {});
  absl::StatusOr<ShardView> Get(uint64_t shard_id) override;
  absl::Status CheckMember(uint64_t shard_id, std::string_view address) override;
  absl::StatusOr<ShardRole> CheckReader(uint64_t shard_id, std::string_view address) override;

  // Chain queries made so far (for tests and metrics).
  uint64_t chain_queries() const;

 private:
  struct Entry {
    ShardView view;
    int64_t fetched_ms = 0;
  };
  // The shard's view, from the cache if it was read less than `max_age_ms` ago (min_refresh_ms
  // for a shard the chain did not have), else from the chain within the query budget.
  absl::StatusOr<ShardView> Read(uint64_t shard_id, int64_t max_age_ms) ABSL_LOCKS_EXCLUDED(mu_);
  // What a cached entry answers: its view, or NOT_FOUND for a shard the chain did not have.
  static absl::StatusOr<ShardView> Answer(const Entry& entry);
  // Takes one query from the budget; false if it is spent.
  bool TakeQuery(int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records what the chain answered at `now_ms` and returns the view to use.
  absl::StatusOr<ShardView> Store(uint64_t shard_id, absl::StatusOr<pb::Shard> shard,
                                  int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  bridge::ChainClient* const chain_;
  common::Clock* const clock_;
  const ChainShardDirectoryOptions options_;
  // Held across a chain query, one at a time; mu_ (the cache) is taken inside it and never held
  // while waiting for it, so cached lookups do not wait behind the chain.
  absl::Mutex chain_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> cache_ ABSL_GUARDED_BY(mu_);
  // The query budget: tokens left (at most max_chain_queries_per_s) and when it was refilled.
  double query_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t query_tokens_ms_ ABSL_GUARDED_BY(mu_) = 0;
  // Chain queries made (for tests and metrics).
  uint64_t chain_queries_ ABSL_GUARDED_BY(mu_) = 0;
};

// A fixed directory, for unit tests and tools.
class StaticShardDirectory final : public ShardDirectory {
 public:
  void Set(ShardView view);
  absl::StatusOr<ShardView> Get(uint64_t shard_id) override;
  absl::Status CheckMember(uint64_t shard_id, std::string_view address) override;
  absl::StatusOr<ShardRole> CheckReader(uint64_t shard_id, std::string_view address) override;

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, ShardView> views_ ABSL_GUARDED_BY(mu_);
};

// Builds a view from a chain shard record.
ShardView ShardViewFromChain(const pb::Shard& shard);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_PEER_SHARD_DIRECTORY_H_
