// Shared parts of the training benchmarks (diloco_bench, utilization_bench): the real corpus cut
// into data shards as a shard run cuts it, the batches a member draws for a round, and K
// collective members on loopback — directly or each behind an emulated wide-area link
// (tests/util/link_emulator.h) — with a fresh authenticated mesh per method.
//
// Thread-safety: BenchCorpus is immutable once loaded. BenchMesh: Open and AllReduceMean from one
// thread; member(i) may then be used by one thread per member.
#ifndef TS_TESTS_BENCH_BENCH_TRAINING_H_
#define TS_TESTS_BENCH_BENCH_TRAINING_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/crypto/secp256k1.h"
#include "sidecar/collective/collective.h"
#include "sidecar/collective/tcp_transport.h"
#include "tests/util/link_emulator.h"
#include "worker/corpus.h"
#include "worker/data_shard.h"
#include "worker/model_config.h"

namespace ts::bench {

struct BenchCorpus {
  worker::Dataset dataset;
  std::vector<worker::ShardRef> refs;  // of dataset.train, in order
  size_t documents = 0;
  uint64_t train_tokens = 0;
};

// The first `files` fortune files, a BPE tokenizer of `vocab` trained on them, and the data set
// (training shards and held-out set) with the worker's defaults.
absl::StatusOr<BenchCorpus> LoadBenchCorpus(uint32_t files, uint32_t vocab);

// A packed dataset folder (`trainshard data pack`; tests/bench/bench_corpus.py), checked as a run
// checks it: its training shards and held-out set.
absl::StatusOr<BenchCorpus> LoadPackedBenchCorpus(const std::string& dir);

// The `steps` batches of `batch` windows member `member` trains on in round `round` (data seed
// "diloco-bench/<round>", host "host-<member>"; drawn by AssignBatches as in a shard run).
absl::StatusOr<std::vector<worker::TokenBatch>> RoundBatches(const BenchCorpus& corpus,
                                                             const worker::ModelConfig& config,
                                                             uint64_t round, uint32_t member,
                                                             uint32_t steps, uint32_t batch);

// K members, one TcpTransport each on 127.0.0.1; with `link`, every member's listener sits behind
// its own LinkEmulator, so each pair of members talks over an emulated link.
class BenchMesh {
 public:
  static absl::StatusOr<std::unique_ptr<BenchMesh>> Start(
      uint32_t k, std::optional<test_util::LinkOptions> link = std::nullopt);
  ~BenchMesh();

  // A new mesh (session) over every member, replacing the previous one.
  absl::Status Open();

  // Mean over members of data[i], in place on every member, one thread per member; checks the
  // results are bit-identical. Returns the wire bytes all members sent.
  absl::StatusOr<uint64_t> AllReduceMean(std::vector<std::vector<float>>& data,
                                         sidecar::CodecSpec codec);

  // Member i's collective on the open mesh, for callers that run the members themselves.
  sidecar::Collective& member(size_t i) { return *collectives_[i]; }
  size_t size() const { return transports_.size(); }
  uint64_t NextOpId() { return ++op_id_; }

 private:
  BenchMesh() = default;
  std::vector<common::PrivateKey> keys_;
  std::vector<std::unique_ptr<sidecar::TcpTransport>> transports_;
  std::vector<std::unique_ptr<test_util::LinkEmulator>> links_;
  sidecar::GroupSpec group_;
  std::vector<std::unique_ptr<sidecar::Mesh>> meshes_;
  std::vector<std::unique_ptr<sidecar::Collective>> collectives_;
  uint64_t op_id_ = 0;
};

double SecondsSince(std::chrono::steady_clock::time_point t0);

// The number after flag argv[*i]: advances *i past it and reads it into *v; false when there is
// none or it is not a number in strtod's syntax.
bool FlagNumber(int argc, char** argv, int* i, double* v);

}  // namespace ts::bench

#endif  // TS_TESTS_BENCH_BENCH_TRAINING_H_
